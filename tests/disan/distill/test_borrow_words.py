"""`disan borrow-words`: a task model reads the words past its own table through the embedding
encoder's table and a fitted map, and a bundle stores that table once for both models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, loaded, make_tiny_checkpoint, run_texts
from support_serving import wait_ready

from disan.text.tokenizer import Vocab

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan import Encoder  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.distill.borrow_words import borrow_words  # noqa: E402
from disan.model import BORROWED_KEY  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402
from model_export.graphs.storage import quantize_rows, round_tables  # noqa: E402

torch.set_num_threads(1)

ONLY_EMBED = ["violin", "piano", "sunset", "harbor"]  # words the task models lack
EMBED_DIM = 12
TEXTS = ["the film was good", "a man is playing the violin", "piano sunset harbor", "the movie was bad"]


@pytest.fixture(scope="module")
def lender(tmp_path_factory) -> Path:
    """A tiny distilled encoder knowing the task models' words (another order) and four more."""
    words = ONLY_EMBED[:2] + list(reversed(WORDS)) + ONLY_EMBED[2:]
    return make_tiny_checkpoint(tmp_path_factory.mktemp("lender") / "student.pt", "encoder", Vocab(words),
                                [], seed=5, proj_dim=24, embed_dim=EMBED_DIM)


@pytest.fixture(scope="module")
def borrowed(tmp_path_factory, tiny_checkpoints, lender) -> Path:
    out = tmp_path_factory.mktemp("borrowed") / "sentiment.pt"
    assert main(["distill", "borrow-words", str(tiny_checkpoints.sentiment), str(lender), str(out)]) == 0
    return out


logits = run_texts  # a sentiment model's logits in PyTorch


def word_vectors(model, vocab: Vocab, words: list[str]) -> torch.Tensor:
    """The vectors the model's encoder reads for `words`."""
    with torch.no_grad():
        return model.encoder.word_vectors(torch.tensor([vocab.ids(words)]))[0]


def test_own_words_read_as_before_and_lent_words_through_the_map(tiny_checkpoints, lender, borrowed):
    before, own_vocab = loaded(tiny_checkpoints.sentiment)
    after, vocab = loaded(borrowed)
    assert vocab.itos[: len(own_vocab)] == own_vocab.itos and vocab.itos[len(own_vocab):] == ONLY_EMBED
    np.testing.assert_array_equal(logits(after, vocab, TEXTS[:1]), logits(before, own_vocab, TEXTS[:1]))
    # a lent word is its lender row through the map, not UNK: the regression this guards
    lend, lend_vocab = loaded(lender)
    row = lend.embed.weight[lend_vocab.stoi["violin"]]
    with torch.no_grad():
        want = after.encoder.borrow_map(row)
    got = word_vectors(after, vocab, ["violin"])[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert not torch.allclose(got, before.encoder.embed.weight[1], atol=1e-3)
    unk_read = logits(before, own_vocab, TEXTS[1:2])  # violin: UNK before
    assert not np.allclose(logits(after, vocab, TEXTS[1:2]), unk_read, atol=1e-4)
    payload = load_checkpoint(borrowed)
    report = payload["borrowing"]
    assert report["lent_words"] == len(ONLY_EMBED) and report["fit_words"] == len(set(WORDS))
    assert report["lender"]["file"] == "student.pt" and str(lender.parent) not in json.dumps(report)


def test_the_map_is_fitted_to_the_shared_words(tiny_checkpoints, lender, tmp_path):
    """A model whose rows are an affine map of the lender's gets that map back: the lent words
    read what training would have given them."""
    lend, lend_vocab = loaded(lender)
    payload = load_checkpoint(tiny_checkpoints.sentiment)
    words = payload["vocab"]
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(EMBED_DIM, 16, generator=gen), torch.randn(16, generator=gen)
    table = payload["model_state"]["encoder.embed.weight"].clone()
    ids = [lend_vocab.stoi[w] for w in words[2:]]
    table[2:] = lend.embed.weight.detach()[ids] @ a + b
    state = {**payload["model_state"], "encoder.embed.weight": table}
    out, report = borrow_words({**payload, "model_state": state}, load_checkpoint(lender))
    assert report["fit_heldout_cosine"] > 0.9999
    model, vocab = model_from_checkpoint(out)[:2]
    for word in ONLY_EMBED:
        lent = lend.embed.weight.detach()[lend_vocab.stoi[word]]
        with torch.no_grad():
            got = model.encoder.borrow_map(model.encoder.borrowed[vocab.stoi[word]])
        torch.testing.assert_close(got, lent @ a + b, atol=1e-4, rtol=1e-4)


def test_refusals(tiny_checkpoints, lender, borrowed):
    sentiment, nli = load_checkpoint(tiny_checkpoints.sentiment), load_checkpoint(tiny_checkpoints.nli)
    with pytest.raises(ValueError, match="NLI or sentiment checkpoint"):
        borrow_words(load_checkpoint(lender), load_checkpoint(lender))
    with pytest.raises(ValueError, match="must be a sentence encoder"):
        borrow_words(sentiment, nli)


def test_borrowing_again_replaces_the_borrowed_words(tiny_checkpoints, lender, borrowed, tmp_path):
    """A model that borrows already borrows from a (new) encoder as the model it started from
    would: the bundle's next encoder knows more words, and the task models follow it."""
    bigger = make_tiny_checkpoint(tmp_path / "bigger.pt", "encoder",
                                  Vocab(ONLY_EMBED + list(WORDS) + ["cello", "dusk"]), [], seed=7,
                                  proj_dim=24, embed_dim=EMBED_DIM)
    again, report = borrow_words(load_checkpoint(borrowed), load_checkpoint(bigger))
    fresh, fresh_report = borrow_words(load_checkpoint(tiny_checkpoints.sentiment), load_checkpoint(bigger))
    assert report == fresh_report and report["lent_words"] == len(ONLY_EMBED) + 2
    assert again["vocab"] == fresh["vocab"] and again["config"] == fresh["config"]
    assert again["model_state"].keys() == fresh["model_state"].keys()
    for key, value in fresh["model_state"].items():
        torch.testing.assert_close(again["model_state"][key], value, atol=0, rtol=0)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_checkpoints, lender, borrowed) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, borrowed, out, embed=lender,
                              embedding_storage="int8,nli=fp16"), log=lambda *_: None)
    return out


def test_the_bundle_serves_lent_words_and_stores_the_table_once(bundle, tiny_checkpoints, lender, borrowed):
    from disan.bundle.manifest import load_manifest

    manifest = load_manifest(bundle)
    assert manifest["verification"]["passed"]
    assert manifest["models"]["sentiment"]["borrowed"]["rows"] == len(Vocab.load(bundle / "vocab.json"))
    assert "borrowed" not in manifest["models"]["nli"]
    model, vocab = loaded(borrowed)
    lend, lend_vocab = loaded(lender)
    round_tables([model, lend], "int8")
    rows = [lend_vocab.stoi[w] for w in vocab.itos[2:]]
    with torch.no_grad():  # the bundle holds the lender's table as stored: int8-rounded
        model.encoder.borrowed[2:] = lend.embed.weight[rows]
    want = torch.softmax(torch.from_numpy(logits(model, vocab, TEXTS)), -1).numpy()
    got = Encoder(bundle, providers="cpu").sentiment(TEXTS)
    labels = manifest["models"]["sentiment"]["labels"]
    np.testing.assert_allclose([[r["scores"][k] for k in labels] for r in got], want, atol=1e-5, rtol=0)
    before, own_vocab = loaded(tiny_checkpoints.sentiment)  # "violin" read as UNK
    round_tables([before], "int8")
    unk = torch.softmax(torch.from_numpy(logits(before, own_vocab, TEXTS[1:2])), -1).numpy()
    assert not np.allclose([got[1]["scores"][k] for k in labels], unk[0], atol=1e-4)
    # the lender's int8 table: once in the weights file, read by both the encoder and the sentiment graphs
    data = (bundle / "weights.data").read_bytes()
    q = quantize_rows(lend.embed.weight.detach().numpy()[[0, 1, *rows]])[0]
    assert data.count(q.tobytes()) == 1


def test_export_needs_the_lender_as_embed(tiny_checkpoints, borrowed, lender, tmp_path):
    with pytest.raises(ValueError, match="export it with that encoder as --embed"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, borrowed, tmp_path / "a"), log=lambda *_: None)
    other = make_tiny_checkpoint(tmp_path / "other.pt", "encoder", loaded(lender)[1], [], seed=9,
                                 proj_dim=24, embed_dim=EMBED_DIM)
    with pytest.raises(ValueError, match="borrowed another table than --embed's"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, borrowed, tmp_path / "b",
                                  embed=other), log=lambda *_: None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_recover_and_verify_a_bundle_that_borrows(bundle, tiny_checkpoints, borrowed, lender, tmp_path):
    from model_export.recover import recover
    from model_export.verify import verify_bundle

    result = verify_bundle(bundle, checkpoints=[tiny_checkpoints.nli, borrowed, lender], dev_limit=20)
    assert result["passed"], result
    written = recover(bundle, tmp_path / "ckpt", log=lambda *_: None)
    model, vocab = loaded(written["sentiment"])
    assert model.cfg.borrowed_rows == len(vocab)
    served = Encoder(bundle, providers="cpu").sentiment(TEXTS)
    labels = load_checkpoint(borrowed)["labels"]
    want = torch.softmax(torch.from_numpy(logits(model, vocab, TEXTS)), -1).numpy()
    np.testing.assert_allclose([[r["scores"][k] for k in labels] for r in served], want, atol=1e-5, rtol=0)


def test_info_says_which_models_borrow_words(bundle):
    pytest.importorskip("fastapi")  # the serve extra
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=bundle, max_wait_ms=1.0))) as client:
        wait_ready(client.get)
        assert client.get("/info").json()["bundle"]["borrowed_words"] == {"sentiment": len(ONLY_EMBED)}


def test_the_graphs_map_only_the_tokens_that_borrow(bundle, tmp_path):
    """Every graph that reads the borrowed table gathers one row per token past the model's own
    table, not one per token: a text of its own words maps nothing."""
    import shutil

    import onnx
    import onnxruntime as ort

    from disan.bundle.manifest import available_variants, load_manifest, variant_files

    manifest = load_manifest(bundle)
    own = manifest["models"]["sentiment"]["config"]["vocab_size"]
    vocab = Vocab.load(bundle / "vocab.json")
    enc = vocab.encode(TEXTS)
    lent = int(((enc.ids >= own) & (enc.ids < len(vocab))).sum())
    assert 0 < lent < int(enc.mask.sum())
    files = {f for s, v in available_variants(manifest) for g, f in variant_files(manifest, s, v).items()
             if g.startswith("sentiment")}
    work = Path(shutil.copytree(bundle, tmp_path / "b"))
    for name in sorted(files):
        model = onnx.load(work / name, load_external_data=False)
        gathers = [n for n in model.graph.node
                   if n.op_type == "Gather" and BORROWED_KEY in n.input[0]
                   and not n.input[0].endswith("/scale")]  # the rows, not their int8 scales
        assert len(gathers) == 1, name
        typed = onnx.shape_inference.infer_shapes(model).graph.value_info
        rows_type = next(v.type.tensor_type.elem_type for v in typed if v.name == gathers[0].output[0])
        model.graph.output.append(onnx.helper.make_tensor_value_info(gathers[0].output[0], rows_type, None))
        onnx.save(model, work / "probe.onnx")
        session = ort.InferenceSession(str(work / "probe.onnx"), providers=["CPUExecutionProvider"])
        for rows, want in [(slice(None), lent), (slice(0, 1), 0)]:  # TEXTS[0]: the model's own words
            got = session.run([gathers[0].output[0]], {"ids": enc.ids[rows], "mask": enc.mask[rows]})[0]
            assert got.shape[:-1] == (want,), name  # [K, d], not [B, n, d]
