"""ONNX export bundle: contract, parity with PyTorch, dynamic shapes, hashes, variants, CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from disan.manifest import FORMAT_VERSION, BundleError, load_manifest, sha256_file, write_manifest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from disan.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from disan.cli import main as cli_main  # noqa: E402
from model_export.export import build_bundle  # noqa: E402
from model_export.verify import check_parity, verify_bundle  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path) -> Path:
    """A private copy of the shared bundle, for tests that modify files."""
    return Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))


@pytest.fixture(scope="module")
def models(tiny_checkpoints):
    """(nli_model, sentiment_model) rebuilt from the fixture checkpoints, eval mode."""
    nli, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.nli))
    sent, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.sentiment))
    return nli, sent


def sess(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def padded(rng, vocab_size: int, batch: int, n: int):
    """ids/mask [batch, n]: row 0 full length, the others random lengths 1..n (PAD = 0)."""
    lengths = np.concatenate([[n], rng.integers(1, n + 1, batch - 1)])
    mask = np.arange(n)[None, :] < lengths[:, None]
    return rng.integers(2, vocab_size, (batch, n)) * mask, mask


def test_manifest_records_contract(tiny_bundle, tiny_checkpoints):
    m = load_manifest(tiny_bundle)
    assert m["format_version"] == FORMAT_VERSION
    assert m["name"] == "tiny-disan"  # the --name given, not a graph's name
    assert m["max_len"] == 128 and m["vocab_size"] == len(tiny_checkpoints.vocab)
    assert m["embedding_dim"] == 2 * m["models"]["nli"]["config"]["d_h"]
    assert m["graphs"]["nli"]["labels"] == tiny_checkpoints.nli_labels
    assert m["graphs"]["sentiment"]["labels"] == tiny_checkpoints.sentiment_labels
    assert m["graphs"]["sentiment_explain"]["outputs"] == [
        "probs", "attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t"]
    assert m["sources"]["nli"]["sha256"] == sha256_file(tiny_checkpoints.nli)
    assert m["sources"]["sentiment"]["sha256"] == sha256_file(tiny_checkpoints.sentiment)
    assert m["models"]["nli"]["metrics"]["dev"]["accuracy"] == pytest.approx(1 / 3, abs=1e-3)
    assert set(m["versions"]) >= {"torch", "onnx", "onnxruntime"}
    assert m["verification"]["passed"] and m["verification"]["tolerance"] <= 1e-5
    on_disk = {p.name for p in tiny_bundle.iterdir() if p.name != "manifest.json"}
    assert set(m["files"]) == on_disk  # every file hashed, and no external .data files
    assert not any(name.endswith(".data") for name in on_disk)


def test_graphs_valid_with_contract_io(tiny_bundle):
    m = load_manifest(tiny_bundle)
    for graph in m["graphs"].values():
        model = onnx.load(str(tiny_bundle / graph["file"]))
        onnx.checker.check_model(model, full_check=True)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
        s = sess(tiny_bundle / graph["file"])
        assert [i.name for i in s.get_inputs()] == graph["inputs"]
        assert [o.name for o in s.get_outputs()] == graph["outputs"]
        for i in s.get_inputs():
            assert i.type == ("tensor(int64)" if i.name.endswith("ids") else "tensor(bool)")
            assert all(isinstance(d, str) for d in i.shape), f"{i.name} has a fixed axis: {i.shape}"
        assert all(o.type == "tensor(float)" for o in s.get_outputs())


def test_attention_is_chunked_in_the_graphs(tiny_bundle):
    """The exported encoder and NLI graphs (and their variants) compute the token2token
    attention in query-row chunks: a Scan; the parity test below covers 1 to 50 steps."""
    import onnx

    from model_export.graphs import ATTENTION_CHUNK_CELLS

    assert load_manifest(tiny_bundle)["attention_chunk_cells"] == ATTENTION_CHUNK_CELLS > 0
    for name in ("encoder", "nli", "encoder.int8", "nli.fp16"):
        ops = {node.op_type for node in onnx.load(str(tiny_bundle / f"{name}.onnx")).graph.node}
        assert "Scan" in ops, name


@pytest.mark.parametrize("batch,n", [(1, 1), (1, 2), (2, 1), (5, 3), (4, 17), (16, 40)])
def test_parity_with_torch_dynamic_shapes(tiny_bundle, models, batch, n):
    """Independent of the export's own check: ORT vs the disan.model classes directly."""
    nli, sent = models
    rng = np.random.default_rng(batch * 100 + n)
    vs = nli.cfg.vocab_size
    ids, mask = padded(rng, vs, batch, n)
    h_ids, h_mask = padded(rng, vs, batch, max(1, n // 2 + 1))
    t = torch.from_numpy
    with torch.no_grad():
        want = {
            "encoder": nli.encoder(t(ids), t(mask)).numpy(),
            "nli": torch.softmax(nli(t(ids), t(mask), t(h_ids), t(h_mask)), -1).numpy(),
            "sentiment": torch.softmax(sent(t(ids), t(mask)), -1).numpy(),
        }
    got = {
        "encoder": sess(tiny_bundle / "encoder.onnx").run(None, {"ids": ids, "mask": mask})[0],
        "nli": sess(tiny_bundle / "nli.onnx").run(None, {
            "premise_ids": ids, "premise_mask": mask, "hypothesis_ids": h_ids, "hypothesis_mask": h_mask})[0],
        "sentiment": sess(tiny_bundle / "sentiment.onnx").run(None, {"ids": ids, "mask": mask})[0],
    }
    for name in want:
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0, err_msg=name)
    for name in ("nli", "sentiment"):
        assert (got[name].argmax(-1) == want[name].argmax(-1)).all()


def test_explain_outputs(tiny_bundle):
    rng = np.random.default_rng(3)
    ids, mask = padded(rng, 50, 4, 9)
    probs, a_fw, a_bw, g_fw, g_bw, s2t = sess(tiny_bundle / "sentiment_explain.onnx").run(
        None, {"ids": ids, "mask": mask})
    plain = sess(tiny_bundle / "sentiment.onnx").run(None, {"ids": ids, "mask": mask})[0]
    np.testing.assert_allclose(probs, plain, atol=1e-6)
    assert a_fw.shape == a_bw.shape == (4, 9, 9) and g_fw.shape == g_bw.shape == s2t.shape == (4, 9)
    pad = ~mask
    assert (a_fw[pad[:, None, :].repeat(9, 1)] == 0).all()  # padding columns get exactly 0
    assert np.triu(a_fw[0]).max() == 0 and np.tril(a_bw[0]).max() == 0  # directional masks
    np.testing.assert_allclose(s2t.sum(-1), 1.0, atol=1e-5)
    assert (s2t[pad] == 0).all() and ((g_fw >= 0) & (g_fw <= 1)).all()


def test_parity_check_can_fail(tiny_bundle, tiny_checkpoints):
    """The verifier must notice a graph that does not match its model."""
    from model_export.graphs import build_wrappers

    nli, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.nli))
    sent, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.sentiment))
    with torch.no_grad():
        sent.out.linear.bias[0] += 0.5  # a different sentiment model (one class logit moved)
    report = check_parity(tiny_bundle, load_manifest(tiny_bundle), build_wrappers(nli, sent))
    assert report["encoder"]["passed"] and report["nli"]["passed"]
    assert not report["sentiment"]["passed"] and report["sentiment"]["max_abs_diff"] > 1e-5


def test_tampered_file_rejected(bundle_copy, capsys):
    path = bundle_copy / "nli.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="nli.onnx.*does not match the manifest"):
        load_manifest(bundle_copy)
    assert cli_main(["verify", str(bundle_copy)]) == 1
    assert "nli.onnx" in capsys.readouterr().out


def test_old_format_version_refused(bundle_copy):
    manifest_path = bundle_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = FORMAT_VERSION - 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError) as err:
        load_manifest(bundle_copy)
    assert f"version {FORMAT_VERSION - 1}" in str(err.value) and f"version {FORMAT_VERSION}" in str(err.value)


def test_variants_recorded(tiny_bundle):
    m = load_manifest(tiny_bundle)
    for variant in ("fp16", "int8"):
        info = m["variants"][variant]
        assert "generated" in info["agreement_vs_fp32"]["data"]  # says which data it used
        for name, graph in m["graphs"].items():
            file = graph["variants"][variant]
            assert (tiny_bundle / file).is_file() and file in info["files"]
            agreement = info["agreement_vs_fp32"][name]
            assert "error" not in agreement, agreement
            if name == "encoder":
                assert agreement["min_cosine"] > 0.5
            else:
                assert 0.9 <= agreement["label_agreement"] <= 1.0
    fp16 = onnx.load(str(tiny_bundle / "nli.fp16.onnx"))
    halves = [onnx.numpy_helper.to_array(i) for i in fp16.graph.initializer if i.data_type == 10]
    assert halves and all(np.isfinite(h).all() for h in halves)  # nothing overflowed to inf
    int8 = onnx.load(str(tiny_bundle / "nli.int8.onnx"))
    assert any(n.op_type == "MatMulInteger" for n in int8.graph.node)


def test_verify_parity_then_consistency(bundle_copy, tiny_bundle):
    result = verify_bundle(tiny_bundle)
    assert result["passed"] and result["mode"] == "parity_vs_pytorch"
    manifest = load_manifest(bundle_copy)
    manifest["sources"]["nli"]["path"] = str(bundle_copy / "gone.pt")
    write_manifest(bundle_copy, manifest)
    result = verify_bundle(bundle_copy)
    assert result["mode"] == "internal_consistency" and "gone.pt" in result["mode_reason"]
    assert result["passed"], result


def test_export_refuses_mismatched_vocabs(tiny_checkpoints, tmp_path, capsys):
    from conftest import SENTIMENT_LABELS, make_tiny_checkpoint

    from disan.text import Vocab

    other = make_tiny_checkpoint(tmp_path / "other.pt", "sentiment", Vocab(["some", "other", "words"]),
                                 SENTIMENT_LABELS, seed=3)
    with pytest.raises(ValueError, match="different vocabularies"):
        build_bundle(tiny_checkpoints.nli, other, tmp_path / "out")
    code = cli_main(["export", "--nli", str(tiny_checkpoints.nli), "--sentiment", str(other),
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "different vocabularies" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_export_refuses_bad_arguments(tiny_checkpoints, tmp_path):
    with pytest.raises(ValueError, match="is a 'sentiment' checkpoint"):
        build_bundle(tiny_checkpoints.sentiment, tiny_checkpoints.sentiment, tmp_path / "a")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("not a bundle")
    with pytest.raises(ValueError, match="not empty"):
        build_bundle(tiny_checkpoints.nli, tiny_checkpoints.sentiment, busy, force=True)
    with pytest.raises(ValueError, match="attention-chunk-cells must be >= 0"):
        build_bundle(tiny_checkpoints.nli, tiny_checkpoints.sentiment, tmp_path / "b", chunk_cells=-1)
    assert not (tmp_path / "b").exists()


def test_variant_accuracy_delta_on_labelled_dev_data(tiny_bundle, tmp_path):
    """With --dev-data the manifest can state each variant's accuracy and its delta vs fp32."""
    import gzip

    from disan.text import Vocab
    from model_export.export import agreement_data
    from model_export.verify import variant_agreement

    (tmp_path / "snli").mkdir()
    (tmp_path / "sst").mkdir()
    labels = ["entailment", "neutral", "contradiction"]
    with gzip.open(tmp_path / "snli" / "dev.jsonl.gz", "wt") as fh:
        for i in range(30):
            row = {"sentence1": "a man is playing music", "sentence2": "the dog runs " * (i % 3 + 1),
                   "gold_label": labels[i % 3]}
            fh.write(json.dumps(row) + "\n")
    with gzip.open(tmp_path / "sst" / "sst5_dev.jsonl.gz", "wt") as fh:
        for i in range(25):
            fh.write(json.dumps({"text": "a good movie " * (i % 4 + 1), "label": i % 5}) + "\n")
    manifest = load_manifest(tiny_bundle)
    vocab = Vocab.load(tiny_bundle / "vocab.json")
    report = variant_agreement(tiny_bundle, manifest, "int8", agreement_data(tmp_path, vocab, 100))
    for name, n in (("nli", 30), ("sentiment", 25)):
        entry = report[name]
        assert entry["n"] == n and 0.0 <= entry["accuracy_fp32"] <= 1.0
        assert entry["accuracy_delta"] == pytest.approx(entry["accuracy"] - entry["accuracy_fp32"])
    assert "accuracy_delta" not in report["encoder"]
