"""`disan ensemble`: sentiment models trained apart over one frozen word table, served as one model
whose probabilities are the mean of theirs, with the table stored once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import loaded, make_tiny_checkpoint, member_of, run_texts

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan import Encoder  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402
from model_export.graphs.storage import quantize_rows, round_tables  # noqa: E402
from model_export.sessions import session  # noqa: E402
from research.cli import main  # noqa: E402
from research.ensemble import join  # noqa: E402

torch.set_num_threads(1)

TEXTS = ["the film was good", "a man is playing the violin", "the movie was bad", "good"]
TABLE = "encoder.embed.weight"


@pytest.fixture(scope="module")
def members(tmp_path_factory, tiny_checkpoints) -> list[Path]:
    root = tmp_path_factory.mktemp("members")
    return [member_of(tiny_checkpoints.sentiment, root / f"m{s}.pt", seed=s) for s in (11, 12)]


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory, tiny_checkpoints, members) -> Path:
    out = tmp_path_factory.mktemp("ensemble") / "sentiment.pt"
    assert main(["ensemble", str(tiny_checkpoints.sentiment), *map(str, members), "--out", str(out)]) == 0
    return out


def probs(path: Path, texts: list[str]) -> np.ndarray:
    model, vocab = loaded(path)
    return torch.softmax(torch.from_numpy(run_texts(model, vocab, texts)), -1).numpy()


def test_the_ensemble_serves_the_mean_of_its_members_probabilities(tiny_checkpoints, members, ensemble):
    alone = [probs(p, TEXTS) for p in [tiny_checkpoints.sentiment, *members]]
    got = probs(ensemble, TEXTS)
    np.testing.assert_allclose(got, np.mean(alone, axis=0), atol=1e-6, rtol=0)
    assert not np.allclose(got, alone[0], atol=1e-4)  # not the first model alone
    payload = load_checkpoint(ensemble)
    assert payload["config"]["members"] == 3
    assert [k for k in payload["model_state"] if k.endswith(TABLE)] == [TABLE]  # the table once
    assert [m["file"] for m in payload["ensemble"]["members"]] == ["m11.pt", "m12.pt"]


def test_explain_gives_the_same_probabilities_and_the_members_mean_attention(ensemble, members):
    model, vocab = loaded(ensemble)
    enc = vocab.encode(TEXTS)
    ids, mask = torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)
    with torch.no_grad():
        logits, shown = model.explain(ids, mask)
        torch.testing.assert_close(logits, model(ids, mask), atol=1e-6, rtol=0)
        words = model.encoder.word_vectors(ids)  # the members read the first model's words
        maps = [m.encoder.read(words, mask, return_tokens=True)[1]["attn_fw"] for m in model.members()]
    assert set(shown) == {"attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t"}
    torch.testing.assert_close(shown["attn_fw"], torch.stack(maps).mean(0), atol=1e-6, rtol=0)


def test_refusals(tiny_checkpoints, members, ensemble, tmp_path):
    first, member = load_checkpoint(tiny_checkpoints.sentiment), load_checkpoint(members[0])
    own_table = load_checkpoint(make_tiny_checkpoint(tmp_path / "own.pt", "sentiment", tiny_checkpoints.vocab,
                                                     first["labels"], seed=13))
    with pytest.raises(ValueError, match="word table is not the first model's"):
        join(first, [own_table], ["own.pt"])
    with pytest.raises(ValueError, match="differs from the first model in d_h"):
        join(first, [load_checkpoint(member_of(tiny_checkpoints.sentiment, tmp_path / "w.pt", 14, d_h=6))],
             ["w.pt"])
    with pytest.raises(ValueError, match="not task 'nli'"):
        join(first, [load_checkpoint(tiny_checkpoints.nli)], ["nli.pt"])
    with pytest.raises(ValueError, match="already an ensemble"):
        join(first, [load_checkpoint(ensemble)], ["ens.pt"])
    with pytest.raises(ValueError, match="single sentiment checkpoint"):
        join(load_checkpoint(ensemble), [member], ["m.pt"])
    with pytest.raises(ValueError, match="at least one member"):
        join(first, [], [])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_checkpoints, ensemble) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, ensemble, out,
                              embedding_storage="int8"), log=lambda *_: None)
    return out


def test_the_bundle_serves_the_ensemble_with_its_table_once(bundle, ensemble):
    from disan.bundle.manifest import load_manifest

    manifest = load_manifest(bundle)
    assert manifest["verification"]["passed"]
    assert manifest["models"]["sentiment"]["config"]["members"] == 3
    model, vocab = loaded(ensemble)
    round_tables([model], "int8")
    want = torch.softmax(torch.from_numpy(run_texts(model, vocab, TEXTS)), -1).numpy()
    enc = vocab.encode(TEXTS)
    for name in ("sentiment.chunked.onnx", "sentiment.onnx"):  # chunked attention in every member, and not
        got = session(bundle / name).run(None, {"ids": enc.ids, "mask": enc.mask})[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    data = (bundle / "weights.data").read_bytes()
    q = quantize_rows(load_checkpoint(ensemble)["model_state"][TABLE].numpy())[0]
    assert data.count(q.tobytes()) == 1


def test_recover_and_verify_an_ensemble_bundle(bundle, tiny_checkpoints, ensemble, tmp_path):
    from model_export.recover import recover
    from model_export.verify import verify_bundle

    result = verify_bundle(bundle, checkpoints=[tiny_checkpoints.nli, ensemble], dev_limit=20)
    assert result["passed"], result
    written = recover(bundle, tmp_path / "ckpt", log=lambda *_: None)
    model, vocab = model_from_checkpoint(load_checkpoint(written["sentiment"]))[:2]
    assert model.cfg.members == 3
    served = Encoder(bundle, providers="cpu").sentiment(TEXTS)
    labels = load_checkpoint(ensemble)["labels"]
    want = torch.softmax(torch.from_numpy(run_texts(model.eval(), vocab, TEXTS)), -1).numpy()
    np.testing.assert_allclose([[r["scores"][k] for k in labels] for r in served], want, atol=1e-5, rtol=0)


def test_info_and_explain_serve_the_ensemble(bundle):
    pytest.importorskip("fastapi")  # the serve extra
    from fastapi.testclient import TestClient
    from support_serving import wait_ready

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=bundle, max_wait_ms=1.0))) as client:
        wait_ready(client.get)
        assert client.get("/info").json()["bundle"]["ensemble_members"] == {"sentiment": 3}
        plain = client.post("/sentiment", json={"texts": TEXTS[:1]}).json()
        shown = client.post("/sentiment", json={"texts": TEXTS[:1], "explain": True}).json()
    assert plain["results"][0]["scores"] == pytest.approx(shown["results"][0]["scores"], abs=1e-5)
