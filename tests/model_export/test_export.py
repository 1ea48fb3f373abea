"""ONNX export bundle: graph sets, contract, parity with PyTorch, shared weights, variants, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from disan.bundle.manifest import (
    FORMAT_VERSION,
    GRAPHS,
    load_manifest,
    sha256_file,
    variant_files,
)

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from conftest import bundle_graph_files, ort_session, padded_ids  # noqa: E402

from disan.cli import main as cli_main  # noqa: E402
from model_export.agreement import NLI  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402

torch.set_num_threads(1)


def test_manifest_records_contract(tiny_bundle, tiny_checkpoints):
    m = load_manifest(tiny_bundle)
    # readable by a server running as another user (the temporary folder it is built in is 0700)
    assert tiny_bundle.stat().st_mode & 0o755 == 0o755
    assert m["format_version"] == FORMAT_VERSION == 2
    assert m["name"] == "tiny-disan"  # the --name given, not a graph's name
    assert m["max_len"] == 128 and m["vocab_size"] == len(tiny_checkpoints.vocab)
    assert m["embedding_dim"] == 2 * m["models"]["nli"]["config"]["d_h"]
    # without --embed: no routes (the defaults: the NLI model's encoder serves /embed and /nli)
    assert "routes" not in m and set(m["models"]) == {"nli", "sentiment"}
    assert set(m["graphs"]) == {"encoder", "encoder_explain", "nli_head", "sentiment", "sentiment_explain"}
    assert {g: e["source"] for g, e in m["graphs"].items()} == {g: GRAPHS[g].task for g in m["graphs"]}
    assert m["graphs"]["nli_head"]["labels"] == tiny_checkpoints.nli_labels
    assert m["graphs"]["sentiment"]["labels"] == tiny_checkpoints.sentiment_labels
    for name, graph in m["graphs"].items():
        assert graph["inputs"] == list(GRAPHS[name].inputs) and graph["outputs"] == list(GRAPHS[name].outputs)
    # one set per provider; the cpu set defaults to fp32 (int8 optional), the gpu set to fp16
    assert {s: (e["provider"], e["default_variant"], list(e["variants"])) for s, e in m["sets"].items()} == {
        "cpu": ("CPUExecutionProvider", "fp32", ["fp32", "int8"]),
        "gpu": ("CUDAExecutionProvider", "fp16", ["fp16", "fp32"])}
    # sources by file name and hash, never by a path of the machine that exported
    assert m["sources"]["nli"] == {"file": "nli.pt", "sha256": sha256_file(tiny_checkpoints.nli)}
    assert m["sources"]["sentiment"]["sha256"] == sha256_file(tiny_checkpoints.sentiment)
    assert str(tiny_checkpoints.nli.parent) not in json.dumps(m)
    assert m["models"]["nli"]["metrics"]["dev"]["accuracy"] == pytest.approx(1 / 3, abs=1e-3)
    assert set(m["versions"]) >= {"torch", "onnx", "onnxruntime"}
    ver = m["verification"]
    assert ver["passed"] and ver["tolerance"] <= 1e-5 and ver["mode"] == "parity_vs_checkpoints"
    for set_name in ("cpu", "gpu"):
        assert set(ver["sets"][set_name]["fp32"]) == set(m["graphs"]) | {NLI}
        assert all(r["passed"] for r in ver["sets"][set_name]["fp32"].values())
    on_disk = {p.name for p in tiny_bundle.iterdir() if p.name != "manifest.json"}
    assert set(m["files"]) == on_disk and set(bundle_graph_files(m)) <= on_disk  # every file hashed


def test_graphs_valid_with_contract_io(tiny_bundle):
    m = load_manifest(tiny_bundle)
    for file, name in bundle_graph_files(m).items():
        onnx.checker.check_model(str(tiny_bundle / file), full_check=True)
        model = onnx.load(str(tiny_bundle / file), load_external_data=False)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
        s = ort_session(tiny_bundle / file)
        assert [i.name for i in s.get_inputs()] == list(GRAPHS[name].inputs), file
        assert [o.name for o in s.get_outputs()] == list(GRAPHS[name].outputs), file
        for i in s.get_inputs():
            kind = i.name.split("_")[-1]
            want = {"ids": "tensor(int64)", "mask": "tensor(bool)"}.get(kind, "tensor(float)")
            assert i.type == want, (file, i.name, i.type)
            assert all(isinstance(d, str) for d in i.shape[:1]), f"{file}: {i.name} has a fixed batch axis"
        assert all(o.type == "tensor(float)" for o in s.get_outputs())


def test_cpu_set_is_chunked_and_gpu_set_is_not(tiny_bundle):
    """The cpu set computes the token2token attention in query-row chunks (a Scan; the parity
    test below covers 1 to 50 steps); the gpu set in one tensor."""
    from model_export.graphs.wrappers import ATTENTION_CHUNK_CELLS

    m = load_manifest(tiny_bundle)
    assert m["sets"]["cpu"]["attention_chunk_cells"] == ATTENTION_CHUNK_CELLS > 0
    assert m["sets"]["gpu"]["attention_chunk_cells"] == 0

    def ops(file):
        graph = onnx.load(str(tiny_bundle / file), load_external_data=False).graph
        return {node.op_type for node in graph.node}

    for variant in ("fp32", "int8"):
        files = variant_files(m, "cpu", variant)
        assert "Scan" in ops(files["encoder"]) and "Scan" in ops(files["sentiment"]), variant
    for variant in ("fp32", "fp16"):
        assert not any("Scan" in ops(f) for f in variant_files(m, "gpu", variant).values()), variant


@pytest.mark.parametrize("batch,n", [(1, 1), (1, 2), (2, 1), (5, 3), (4, 17), (16, 40)])
def test_parity_with_torch_dynamic_shapes(tiny_bundle, tiny_models, batch, n):
    """Independent of the export's own check: ORT vs the disan.model classes directly, both sets."""
    nli, sent = tiny_models
    m = load_manifest(tiny_bundle)
    rng = np.random.default_rng(batch * 100 + n)
    vs = nli.cfg.vocab_size
    ids, mask = padded_ids(rng, vs, batch, n)
    h_ids, h_mask = padded_ids(rng, vs, batch, max(1, n // 2 + 1))
    t = torch.from_numpy
    with torch.no_grad():
        want = {"encoder": nli.encoder(t(ids), t(mask)).numpy(),
                "nli": torch.softmax(nli(t(ids), t(mask), t(h_ids), t(h_mask)), -1).numpy(),
                "sentiment": torch.softmax(sent(t(ids), t(mask)), -1).numpy()}
    for set_name in ("cpu", "gpu"):
        files = variant_files(m, set_name, "fp32")
        enc = ort_session(tiny_bundle / files["encoder"])
        u = enc.run(None, {"ids": ids, "mask": mask})[0]
        v = enc.run(None, {"ids": h_ids, "mask": h_mask})[0]
        got = {"encoder": u,
               "nli": ort_session(tiny_bundle / files["nli_head"]).run(
                   None, {"premise_embedding": u, "hypothesis_embedding": v})[0],
               "sentiment": ort_session(tiny_bundle / files["sentiment"]).run(
                   None, {"ids": ids, "mask": mask})[0]}
        for name in want:
            assert got[name].shape == want[name].shape
            np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0, err_msg=f"{set_name}/{name}")
        for name in ("nli", "sentiment"):
            assert (got[name].argmax(-1) == want[name].argmax(-1)).all()


def test_explain_outputs(tiny_bundle, tiny_models):
    rng = np.random.default_rng(3)
    ids, mask = padded_ids(rng, 50, 4, 9)
    probs, a_fw, a_bw, g_fw, g_bw, s2t = ort_session(tiny_bundle / "sentiment_explain.onnx").run(
        None, {"ids": ids, "mask": mask})
    plain = ort_session(tiny_bundle / "sentiment.onnx").run(None, {"ids": ids, "mask": mask})[0]
    np.testing.assert_allclose(probs, plain, atol=1e-6)
    assert a_fw.shape == a_bw.shape == (4, 9, 9) and g_fw.shape == g_bw.shape == s2t.shape == (4, 9)
    pad = ~mask
    assert (a_fw[pad[:, None, :].repeat(9, 1)] == 0).all()  # padding columns get exactly 0
    assert np.triu(a_fw[0]).max() == 0 and np.tril(a_bw[0]).max() == 0  # directional masks
    np.testing.assert_allclose(s2t.sum(-1), 1.0, atol=1e-5)
    assert (s2t[pad] == 0).all() and ((g_fw >= 0) & (g_fw <= 1)).all()
    # the encoder's explain graph: the same embedding, its token weights, and leave-one-out
    # vectors equal to the encoder's pooling with that token masked out of source2token
    emb, w, loo = ort_session(tiny_bundle / "encoder_explain.onnx").run(
        None, {"ids": ids, "mask": mask})
    plain = ort_session(tiny_bundle / "encoder.onnx").run(None, {"ids": ids, "mask": mask})[0]
    np.testing.assert_allclose(emb, plain, atol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert loo.shape == (4, 9, emb.shape[1])
    encoder = tiny_models[0].encoder
    with torch.no_grad():
        _, ex = encoder(torch.from_numpy(ids), torch.from_numpy(mask), return_tokens=True)
        row, i = 0, 4
        keep = torch.from_numpy(mask[row: row + 1].copy())
        keep[0, i] = False
        want, _ = encoder.s2t(ex["u"][row: row + 1], keep)
    np.testing.assert_allclose(loo[row, i], want[0].numpy(), atol=1e-5)


def test_variants_recorded(tiny_bundle):
    m = load_manifest(tiny_bundle)
    for set_name, variant in (("gpu", "fp16"), ("cpu", "int8")):
        info = m["sets"][set_name]["variants"][variant]
        agreement = info["agreement_vs_fp32"]
        assert "generated" in agreement["data"]  # says which data it used
        assert set(agreement) == {"data", NLI} | (set(info["files"]) - {"nli_head"})
        for name, entry in agreement.items():
            if name == "data":
                continue
            assert entry["finite"] and entry["n"] > 0
            if name.startswith("encoder"):
                assert entry["min_cosine"] > (0.999 if variant == "fp16" else 0.5)
            else:
                assert 0.9 <= entry["label_agreement"] <= 1.0
    assert m["sets"]["gpu"]["variants"]["fp16"]["meets_bars"] is True  # the gpu set's default
    int8 = onnx.load(str(tiny_bundle / variant_files(m, "cpu", "int8")["nli_head"]), load_external_data=False)
    assert any(n.op_type == "MatMulInteger" for n in int8.graph.node)


def test_export_refuses_mismatched_vocabs(tiny_checkpoints, tmp_path, capsys):
    from conftest import SENTIMENT_LABELS, make_tiny_checkpoint

    from disan.text.tokenizer import Vocab

    other = make_tiny_checkpoint(tmp_path / "other.pt", "sentiment", Vocab(["some", "other", "words"]),
                                 SENTIMENT_LABELS, seed=3)
    with pytest.raises(ValueError, match="different vocabularies"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, other, tmp_path / "out"))
    code = cli_main(["export", "--nli", str(tiny_checkpoints.nli), "--sentiment", str(other),
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "different vocabularies" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_export_takes_a_vocabulary_that_extends_the_other(tiny_checkpoints, tmp_path):
    """A sentiment model retrained over more words than the NLI model's (or a recovered checkpoint
    carrying the whole bundle vocabulary): the ids both use mean the same words, so the bundle
    serves the longer list and the NLI model reads the extra ids as UNK."""
    from conftest import SENTIMENT_LABELS, make_tiny_checkpoint

    from disan.text.tokenizer import Vocab

    longer = Vocab([*tiny_checkpoints.vocab.itos[2:], "zebra", "quokka"])
    sent = make_tiny_checkpoint(tmp_path / "sent.pt", "sentiment", longer, SENTIMENT_LABELS, seed=4)
    m = build_bundle(ExportConfig(tiny_checkpoints.nli, sent, tmp_path / "out", sets=("cpu",),
                                  fp16=False), log=lambda *a: None)
    assert m["vocab_size"] == len(longer)
    assert Vocab.load(tmp_path / "out" / "vocab.json").itos == longer.itos
    assert m["models"]["nli"]["config"]["vocab_size"] == len(tiny_checkpoints.vocab)
    assert m["models"]["sentiment"]["config"]["vocab_size"] == len(longer)


def test_export_refuses_bad_arguments(tiny_checkpoints, tmp_path):
    with pytest.raises(ValueError, match="is a 'sentiment' checkpoint"):
        build_bundle(ExportConfig(tiny_checkpoints.sentiment, tiny_checkpoints.sentiment, tmp_path / "a"))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("not a bundle")
    with pytest.raises(ValueError, match="not empty"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, busy, force=True))
    with pytest.raises(ValueError, match="attention-chunk-cells must be >= 0"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, tmp_path / "b",
                                  chunk_cells=-1))
    with pytest.raises(ValueError, match="--sets"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, tmp_path / "b",
                                  sets=("tpu",)))
    assert not (tmp_path / "b").exists()




def test_graphs_carry_no_machine_paths_or_memory_addresses(tiny_bundle):
    """The exporter annotates every node with the Python stack that made it (this checkout's
    file paths) and fx names that hold memory addresses; shipped graphs carry neither, so they
    name no machine and the same checkpoints export to the same bytes."""
    from pathlib import Path

    import disan

    source_tree = str(Path(disan.__file__).resolve().parent.parent).encode()
    for path in sorted(tiny_bundle.glob("*.onnx")):
        data = path.read_bytes()
        assert source_tree not in data and b"site-packages" not in data, path.name
        assert b" at 0x" not in data, path.name
        model = onnx.load(str(path), load_external_data=False)
        assert not [n.name for n in model.graph.node if len(n.metadata_props)], path.name
