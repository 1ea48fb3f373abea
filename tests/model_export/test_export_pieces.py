"""`disan export --embed` with an encoder that reads subword pieces (`disan distill student`): the
bundle carries its tokenizer.json, the manifest names it for the encoder's graphs, and the runtime,
`Encoder` and the service read each route's text through its graph's tokenizer (pieces for the
embedding routes, words for /nli and /sentiment)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, make_tiny_checkpoint, tiny_piece_tokenizer
from support_serving import wait_ready

from disan.bundle.manifest import BundleError, graph_tokenizer, load_manifest, write_manifest
from disan.text.tokenizer import Vocab

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
tokenizers = pytest.importorskip("tokenizers")

from disan import Encoder  # noqa: E402
from disan.runtime.runtime import load_offline  # noqa: E402
from disan.text.pieces import PieceTokenizer, read_tokenizer  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint, write_checkpoint  # noqa: E402
from model_export.bundle_diff import compare, route_fingerprints  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402
from model_export.verify import verify_bundle  # noqa: E402

torch.set_num_threads(1)

# "phytosterol" is a word no vocabulary of the tiny models has: the piece encoder still reads it
# as pieces it knows, where a word model reads one unknown id.
TEXTS = ["a man is playing the guitar", "phytosterol lowers cholesterol", "the movie was great !", "dog"]


@pytest.fixture(scope="module")
def piece_ckpt(tmp_path_factory) -> Path:
    """A tiny piece encoder checkpoint as `disan distill student` writes one: no word list, its
    tokenizer.json inside, Matryoshka sizes."""
    tok = tiny_piece_tokenizer()
    path = tmp_path_factory.mktemp("pieces") / "student.pt"
    filler = Vocab([f"w{i}" for i in range(len(tok) - 2)])  # a table of len(tok) rows
    make_tiny_checkpoint(path, "encoder", filler, [], seed=7, proj_dim=16, embed_dim=12)
    payload = load_checkpoint(path)
    payload.update(vocab=[], tokenizer=tok.to_str(), matryoshka_dims=[16, 8])
    write_checkpoint(path, payload)
    return path


@pytest.fixture(scope="module")
def borrowed(tmp_path_factory, tiny_checkpoints) -> Path:
    """The tiny sentiment model reading the words past its table through a word encoder's."""
    from disan.cli import main

    root = tmp_path_factory.mktemp("lent")
    lender = make_tiny_checkpoint(root / "lender.pt", "encoder", Vocab(["violin", "piano", *WORDS]), [],
                                  seed=5, proj_dim=16, embed_dim=12)
    assert main(["distill", "borrow-words", str(tiny_checkpoints.sentiment), str(lender),
                 str(root / "sentiment.pt")]) == 0
    return root / "sentiment.pt"


def export_with(tiny_checkpoints, sentiment: Path, embed: Path, out: Path) -> Path:
    """The tiny NLI model, `sentiment` and the encoder `embed` exported to `out` (cpu set; tables in
    fp32, the borrowed word table in int8)."""
    build_bundle(ExportConfig(tiny_checkpoints.nli, sentiment, out, embed=embed, name="tiny-pieces",
                              sets=("cpu",), embedding_storage="fp32,borrowed=int8"), log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def piece_bundle(tmp_path_factory, tiny_checkpoints, borrowed, piece_ckpt) -> Path:
    """NLI, a sentiment model that borrowed a word table, and the piece encoder (one export)."""
    return export_with(tiny_checkpoints, borrowed, piece_ckpt, tmp_path_factory.mktemp("pieces") / "bundle")


def _reference(ckpt: Path, texts: list[str]) -> np.ndarray:
    payload = load_checkpoint(ckpt)
    model, _, _ = model_from_checkpoint(payload)
    tok = PieceTokenizer.from_str(payload["tokenizer"])
    enc = tok.encode(texts)
    with torch.no_grad():
        return model(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)).numpy()


def test_the_manifest_names_the_piece_tokenizer_for_the_encoders_graphs(piece_bundle) -> None:
    manifest = load_manifest(piece_bundle)
    assert (piece_bundle / "tokenizer.json").is_file() and "tokenizer.json" in manifest["files"]
    assert graph_tokenizer(manifest, "encoder") == "tokenizer.json"
    assert graph_tokenizer(manifest, "nli_encoder") == "vocab.json"
    assert graph_tokenizer(manifest, "sentiment") == "vocab.json"
    assert manifest["models"]["embed"]["vocab"]["tokenizer"] == "tokenizer.json"
    assert manifest["verification"]["passed"]
    assert manifest["matryoshka_dims"] == [16, 8]


def test_each_route_reads_through_its_graphs_tokenizer(piece_bundle, piece_ckpt) -> None:
    runtime = load_offline(piece_bundle)
    assert isinstance(runtime.tokenizer("embed"), PieceTokenizer)
    assert isinstance(runtime.tokenizer("nli"), Vocab) and isinstance(runtime.tokenizer("sentiment"), Vocab)
    pieces = runtime.tokenizer("embed").tokens("phytosterol")
    assert len(pieces) > 1 and "[UNK]" not in pieces  # a word no vocabulary has, read as pieces
    encoder = Encoder(piece_bundle)
    got, want = encoder.encode(TEXTS), _reference(piece_ckpt, TEXTS)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.9999, cos
    assert encoder.encode(TEXTS, dimensions=8).shape == (len(TEXTS), 8)
    assert [r["label"] for r in encoder.nli([(TEXTS[0], TEXTS[2])])][0] in runtime.labels["nli"]
    assert len(encoder.sentiment(TEXTS)) == len(TEXTS)


def test_verify_checks_the_piece_graphs_with_piece_ids(piece_bundle, piece_ckpt, tiny_checkpoints,
                                                      borrowed) -> None:
    report = verify_bundle(piece_bundle, checkpoints=[piece_ckpt, tiny_checkpoints.nli, borrowed])
    assert report["passed"], json.dumps(report)[:2000]


def test_the_fingerprint_reads_the_tokenizer_file(piece_bundle, tmp_path) -> None:
    """Another tokenizer.json is another embed route (the same graphs read other ids); the
    word routes stay the same."""
    copy = tmp_path / "copy"
    shutil.copytree(piece_bundle, copy)
    data = json.loads((copy / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[5:7]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (copy / "tokenizer.json").write_text(json.dumps(data))
    manifest = json.loads((copy / "manifest.json").read_text())
    write_manifest(copy, manifest)
    diff = compare(piece_bundle, copy)
    assert "embed" in diff["changed"] and "nli" not in diff["changed"] and "sentiment" not in diff["changed"]
    assert route_fingerprints(piece_bundle)["embed"] != route_fingerprints(copy)["embed"]


def test_a_graph_naming_a_missing_or_odd_tokenizer_is_refused(piece_bundle, tmp_path) -> None:
    for name in ("../tokenizer.json", "tokenizer.txt", "absent.json"):
        copy = tmp_path / name.replace("/", "_")
        shutil.copytree(piece_bundle, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["graphs"]["encoder"]["tokenizer"] = name
        write_manifest(copy, manifest)
        with pytest.raises(BundleError, match="tokenizer"):
            load_manifest(copy)


def test_read_tokenizer_tells_words_from_pieces(piece_bundle) -> None:
    assert isinstance(read_tokenizer(piece_bundle / "vocab.json"), Vocab)
    assert isinstance(read_tokenizer(piece_bundle / "tokenizer.json"), PieceTokenizer)


def test_the_service_tokenizes_and_embeds_with_pieces(piece_bundle, piece_ckpt) -> None:
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=piece_bundle, max_wait_ms=1.0))) as client:
        wait_ready(client.get)
        tokens = client.post("/tokenize", json={"texts": ["phytosterol"]}).json()["results"][0]
        assert len(tokens["tokens"]) > 1 and tokens["unknown"] == []
        body = client.post("/embed", json={"texts": TEXTS}).json()
        got = np.array([d for d in body["embeddings"]], dtype=np.float32)
        want = _reference(piece_ckpt, TEXTS)
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() > 0.9999
        nli = client.post("/nli", json={"pairs": [{"premise": TEXTS[0], "hypothesis": TEXTS[2]}]})
        assert nli.status_code == 200, nli.text
        assert client.post("/sentiment", json={"texts": TEXTS}).status_code == 200


def test_task_models_keep_the_word_table_they_borrowed(piece_bundle, borrowed) -> None:
    """A piece encoder cannot lend its table: the sentiment model keeps its own borrowed copy,
    stored (int8 here) and served as exported (the verify test checks it too)."""
    from conftest import loaded, run_texts

    from model_export.graphs.storage import round_table

    manifest = load_manifest(piece_bundle)
    assert manifest["verification"]["passed"]
    assert manifest["models"]["sentiment"]["borrowed"]["from"] == "own"
    assert manifest["weights"]["embedding_storage"]["borrowed"] == "int8"
    model, vocab = loaded(borrowed)
    round_table(model.encoder.borrowed, "int8", "sentiment")
    texts = ["a man is playing the violin", "piano", "the movie was great !"]
    want = torch.softmax(torch.from_numpy(run_texts(model, vocab, texts)), -1).numpy()
    got = Encoder(piece_bundle).sentiment(texts)
    labels = manifest["models"]["sentiment"]["labels"]
    np.testing.assert_allclose([[r["scores"][k] for k in labels] for r in got], want, atol=1e-5, rtol=0)


def test_recover_gives_the_piece_encoder_back_with_its_tokenizer(piece_bundle, piece_ckpt, tmp_path) -> None:
    """`python -m model_export.recover` of a piece bundle: embed.pt reads pieces (its tokenizer.json
    inside, no word list) and serves the vectors of the checkpoint exported; the task models keep the
    bundle's words."""
    from model_export.recover import recover

    written = recover(piece_bundle, tmp_path / "r", log=lambda *_: None)
    embed = load_checkpoint(written["embed"])
    pieces = PieceTokenizer.from_str(load_checkpoint(piece_ckpt)["tokenizer"]).batch_ids(TEXTS)
    assert embed["vocab"] == [] and PieceTokenizer.from_str(embed["tokenizer"]).batch_ids(TEXTS) == pieces
    assert "tokenizer" not in load_checkpoint(written["nli"]) and load_checkpoint(written["nli"])["vocab"]
    np.testing.assert_allclose(_reference(written["embed"], TEXTS), _reference(piece_ckpt, TEXTS), atol=1e-5)


@pytest.fixture(scope="module")
def whole_ckpt(tmp_path_factory, borrowed, piece_ckpt) -> Path:
    """The piece encoder reading whole the words of the table the sentiment model borrowed."""
    from disan.cli import main

    out = tmp_path_factory.mktemp("whole") / "student.pt"
    assert main(["distill", "whole-words", str(piece_ckpt), str(borrowed), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def whole_bundle(tmp_path_factory, tiny_checkpoints, borrowed, whole_ckpt) -> Path:
    return export_with(tiny_checkpoints, borrowed, whole_ckpt, tmp_path_factory.mktemp("whole") / "bundle")


def _stored_at(bundle: Path) -> dict[str, tuple[str, str]]:
    """{initializer: (offset, length) in the weights file} over the bundle's graphs."""
    import onnx

    at = {}
    for path in bundle.glob("*.onnx"):
        for init in onnx.load(str(path), load_external_data=False).graph.initializer:
            ext = {e.key: e.value for e in init.external_data}
            if ext:
                at[init.name] = (ext["offset"], ext["length"])
    return at


def test_whole_words_read_the_table_the_task_models_borrowed_stored_once(whole_bundle, whole_ckpt, borrowed,
                                                                          tiny_checkpoints) -> None:
    from model_export.graphs.storage import round_table

    manifest = load_manifest(whole_bundle)
    assert manifest["verification"]["passed"]
    at = _stored_at(whole_bundle)
    assert at["embed/borrowed/int8"] == at["sentiment/encoder.borrowed/int8"]  # the same bytes
    entry = manifest["models"]["embed"]["borrowed"]
    assert entry["from"] == "own" and entry["offset"] == manifest["models"]["embed"]["config"]["vocab_size"]
    runtime = load_offline(whole_bundle)
    assert runtime.tokenizer("embed").tokens("violin") == ["violin"]
    payload = load_checkpoint(whole_ckpt)
    model, _, _ = model_from_checkpoint(payload)
    round_table(model.borrowed, "int8", "embed")  # as the bundle stores it
    tok = PieceTokenizer.from_str(payload["tokenizer"])
    texts = [*TEXTS, "a man is playing the violin", "piano"]
    enc = tok.encode(texts)
    with torch.no_grad():
        want = model(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)).numpy()
    np.testing.assert_allclose(Encoder(whole_bundle).encode(texts, normalize=False), want, atol=1e-4)
    report = verify_bundle(whole_bundle, checkpoints=[whole_ckpt, tiny_checkpoints.nli, borrowed])
    assert report["passed"], json.dumps(report)[:2000]


def test_whole_words_from_another_table_are_refused(tiny_checkpoints, borrowed, piece_ckpt, tmp_path) -> None:
    """Reading another table than the one the task models borrowed would store a second copy."""
    from disan.cli import main

    other = make_tiny_checkpoint(tmp_path / "other.pt", "encoder", Vocab(["violin", "piano", *WORDS]), [],
                                 seed=9, proj_dim=16, embed_dim=12)
    assert main(["distill", "whole-words", str(piece_ckpt), str(other), str(tmp_path / "w.pt")]) == 0
    with pytest.raises(ValueError, match="whole-words"):
        export_with(tiny_checkpoints, borrowed, tmp_path / "w.pt", tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_info_counts_only_the_task_models_borrowed_words(whole_bundle) -> None:
    """The encoder's whole words are no words the task models borrow: /info's borrowed_words names
    the sentiment model's two (violin, piano) and not the encoder."""
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=whole_bundle, max_wait_ms=1.0))) as client:
        wait_ready(client.get)
        assert client.get("/info").json()["bundle"]["borrowed_words"] == {"sentiment": 2}
        tokens = client.post("/tokenize", json={"texts": ["violin"]}).json()["results"][0]
        assert tokens["tokens"] == ["violin"] and tokens["unknown"] == []


def test_recover_gives_the_whole_words_encoder_back(whole_bundle, whole_ckpt, tmp_path) -> None:
    """The recovered encoder reads the words whole through the table the bundle stores (int8 here)."""
    from model_export.graphs.storage import round_table
    from model_export.recover import recover

    written = recover(whole_bundle, tmp_path / "r", log=lambda *_: None)
    embed = load_checkpoint(written["embed"])
    assert embed["config"]["borrowed_offset"] == load_checkpoint(whole_ckpt)["config"]["borrowed_offset"]
    # and says how many words it reads whole, as the bundle's manifest does, for the next export
    whole = load_checkpoint(whole_ckpt)["whole_words"]["whole_words"]
    assert embed["whole_words"]["whole_words"] == whole > 0
    payload = load_checkpoint(whole_ckpt)
    round_table(payload["model_state"]["borrowed"], "int8", "embed")
    write_checkpoint(tmp_path / "stored.pt", payload)
    texts = [*TEXTS, "the violin and the piano"]
    np.testing.assert_allclose(_reference(written["embed"], texts), _reference(tmp_path / "stored.pt", texts),
                               atol=1e-5)


def test_a_zero_borrow_map_bias_verifies_from_the_bundle_alone(tiny_checkpoints, borrowed, whole_ckpt,
                                                               tmp_path) -> None:
    """An identity map (a graft's) has a zero bias, which the exporter drops from the graph; `disan
    verify` without checkpoints rebuilds the encoder from the graphs all the same."""
    payload = load_checkpoint(whole_ckpt)
    payload["model_state"]["borrow_map.bias"].zero_()
    write_checkpoint(tmp_path / "zero.pt", payload)
    report = verify_bundle(export_with(tiny_checkpoints, borrowed, tmp_path / "zero.pt", tmp_path / "bundle"))
    assert report["passed"], json.dumps(report)[:2000]


def test_calibrate_rounds_the_borrowed_table_as_a_piece_bundle_stores_it(piece_bundle, borrowed) -> None:
    """Beside a piece encoder the task models' word table has a storage of its own (int8 here, the
    encoder's table fp32): `disan calibrate`'s model must read it as served."""
    from conftest import run_texts

    from model_export.calibrate import stored_task_model

    manifest = load_manifest(piece_bundle)
    payload = load_checkpoint(borrowed)
    model = stored_task_model(payload, manifest["weights"])
    texts = ["a man is playing the violin", "piano", "the movie was great !"]
    want = torch.softmax(torch.from_numpy(run_texts(model, Vocab(payload["vocab"]), texts)), -1).numpy()
    got = Encoder(piece_bundle).sentiment(texts)
    labels = manifest["models"]["sentiment"]["labels"]
    np.testing.assert_allclose([[r["scores"][k] for k in labels] for r in got], want, atol=1e-5, rtol=0)


def test_a_deeper_encoder_exports_and_serves_its_own_vectors(tiny_checkpoints, borrowed, tmp_path) -> None:
    """An encoder with a further directional layer (`layers=2`, its gain set, so the layer counts)
    exports, verifies, and serves the vectors the checkpoint computes."""
    tok = tiny_piece_tokenizer()
    path = tmp_path / "deep.pt"
    filler = Vocab([f"w{i}" for i in range(len(tok) - 2)])
    make_tiny_checkpoint(path, "encoder", filler, [], seed=9, proj_dim=16, embed_dim=12, layers=2)
    payload = load_checkpoint(path)
    gain = [k for k in payload["model_state"] if k.endswith("upper.0.gain")]
    assert len(gain) == 1
    payload["model_state"][gain[0]] = torch.full_like(payload["model_state"][gain[0]], 0.7)
    payload.update(vocab=[], tokenizer=tok.to_str(), matryoshka_dims=[16, 8])
    write_checkpoint(path, payload)
    bundle = export_with(tiny_checkpoints, borrowed, path, tmp_path / "bundle")
    assert load_manifest(bundle)["verification"]["passed"]
    got, want = Encoder(bundle).encode(TEXTS), _reference(path, TEXTS)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.9999, cos
    payload["model_state"][gain[0]].zero_()
    write_checkpoint(tmp_path / "flat.pt", payload)
    assert np.abs(_reference(tmp_path / "flat.pt", TEXTS) - want).max() > 1e-4  # the layer counted
