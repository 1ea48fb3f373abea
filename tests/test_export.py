"""ONNX export bundle: graph sets, contract, parity with PyTorch, shared weights, variants, CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from disan.manifest import (
    FORMAT_VERSION,
    GRAPHS,
    BundleError,
    load_manifest,
    sha256_file,
    variant_files,
    write_manifest,
)

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from disan.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from disan.cli import main as cli_main  # noqa: E402
from model_export.agreement import NLI  # noqa: E402
from model_export.export import build_bundle  # noqa: E402
from model_export.verify import check_parity, references_from_models, verify_bundle  # noqa: E402

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


def all_files(manifest) -> dict[str, str]:
    """file -> graph name, over every set and variant."""
    return {f: g for s, e in manifest["sets"].items() for v in e["variants"]
            for g, f in variant_files(manifest, s, v).items()}


def test_manifest_records_contract(tiny_bundle, tiny_checkpoints):
    m = load_manifest(tiny_bundle)
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
    assert set(m["files"]) == on_disk and set(all_files(m)) <= on_disk  # every file hashed


def test_graphs_valid_with_contract_io(tiny_bundle):
    m = load_manifest(tiny_bundle)
    for file, name in all_files(m).items():
        onnx.checker.check_model(str(tiny_bundle / file), full_check=True)
        model = onnx.load(str(tiny_bundle / file), load_external_data=False)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
        s = sess(tiny_bundle / file)
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
    from model_export.graphs import ATTENTION_CHUNK_CELLS

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


def test_weights_stored_once(tiny_bundle, models):
    """Size accounting: every large tensor lives in weights.data once, whatever the number of
    graphs, sets and variants reading it; graph files hold no large weights of their own."""
    from model_export.weights import EXTERNAL_MIN_BYTES

    m = load_manifest(tiny_bundle)
    data = (tiny_bundle / "weights.data").read_bytes()
    for model in models:  # each encoder's embedding table: once, shared by cpu, gpu, explain, fp16
        table = model.encoder.embed.weight.detach().numpy().tobytes()
        assert data.count(table) == 1
    seen: dict[tuple, int] = {}
    for file in all_files(m):
        graph = onnx.load(str(tiny_bundle / file), load_external_data=False).graph
        for init in graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in init.external_data}
                assert info["location"] == "weights.data"
                seen.setdefault((info["offset"], info["length"]), 0)
            else:  # kept inline: small constants only
                assert len(init.raw_data) < EXTERNAL_MIN_BYTES, (file, init.name)
    assert len(seen) == m["weights"]["tensors"]  # every stored tensor is read by some graph
    assert m["weights"]["bytes"] == len(data)
    assert m["sizes"]["total_bytes"] == sum(p.stat().st_size for p in tiny_bundle.iterdir()
                                            if p.name != "manifest.json")
    # the fp16 graphs read the fp32 tensors and cast them: no second copy in half precision
    fp16 = onnx.load(str(tiny_bundle / variant_files(m, "gpu", "fp16")["nli_head"]), load_external_data=False)
    big_halves = [i for i in fp16.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16
                  and i.data_location != onnx.TensorProto.EXTERNAL and len(i.raw_data) >= EXTERNAL_MIN_BYTES]
    assert not big_halves and any(n.op_type == "Cast" for n in fp16.graph.node)


@pytest.mark.parametrize("batch,n", [(1, 1), (1, 2), (2, 1), (5, 3), (4, 17), (16, 40)])
def test_parity_with_torch_dynamic_shapes(tiny_bundle, models, batch, n):
    """Independent of the export's own check: ORT vs the disan.model classes directly, both sets."""
    nli, sent = models
    m = load_manifest(tiny_bundle)
    rng = np.random.default_rng(batch * 100 + n)
    vs = nli.cfg.vocab_size
    ids, mask = padded(rng, vs, batch, n)
    h_ids, h_mask = padded(rng, vs, batch, max(1, n // 2 + 1))
    t = torch.from_numpy
    with torch.no_grad():
        want = {"encoder": nli.encoder(t(ids), t(mask)).numpy(),
                "nli": torch.softmax(nli(t(ids), t(mask), t(h_ids), t(h_mask)), -1).numpy(),
                "sentiment": torch.softmax(sent(t(ids), t(mask)), -1).numpy()}
    for set_name in ("cpu", "gpu"):
        files = variant_files(m, set_name, "fp32")
        enc = sess(tiny_bundle / files["encoder"])
        u = enc.run(None, {"ids": ids, "mask": mask})[0]
        v = enc.run(None, {"ids": h_ids, "mask": h_mask})[0]
        got = {"encoder": u,
               "nli": sess(tiny_bundle / files["nli_head"]).run(
                   None, {"premise_embedding": u, "hypothesis_embedding": v})[0],
               "sentiment": sess(tiny_bundle / files["sentiment"]).run(None, {"ids": ids, "mask": mask})[0]}
        for name in want:
            assert got[name].shape == want[name].shape
            np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0, err_msg=f"{set_name}/{name}")
        for name in ("nli", "sentiment"):
            assert (got[name].argmax(-1) == want[name].argmax(-1)).all()


def test_explain_outputs(tiny_bundle, models):
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
    # the encoder's explain graph: the same embedding, its token weights, and leave-one-out
    # vectors equal to the encoder's pooling with that token masked out of source2token
    emb, w, loo = sess(tiny_bundle / "encoder_explain.onnx").run(None, {"ids": ids, "mask": mask})
    plain = sess(tiny_bundle / "encoder.onnx").run(None, {"ids": ids, "mask": mask})[0]
    np.testing.assert_allclose(emb, plain, atol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert loo.shape == (4, 9, emb.shape[1])
    encoder = models[0].encoder
    with torch.no_grad():
        _, ex = encoder(torch.from_numpy(ids), torch.from_numpy(mask), return_tokens=True)
        row, i = 0, 4
        keep = torch.from_numpy(mask[row: row + 1].copy())
        keep[0, i] = False
        want, _ = encoder.s2t(ex["u"][row: row + 1], keep)
    np.testing.assert_allclose(loo[row, i], want[0].numpy(), atol=1e-5)


def test_parity_check_can_fail(tiny_bundle, tiny_checkpoints, models):
    """The verifier must notice a graph that does not match its model."""
    sent, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.sentiment))
    with torch.no_grad():
        sent.out.linear.bias[0] += 0.5  # a different sentiment model (one class logit moved)
    m = load_manifest(tiny_bundle)
    refs = references_from_models(models[0], sent)
    report = check_parity(tiny_bundle, m, refs, variant_files(m, "gpu", "fp32"))
    assert report["encoder"]["passed"] and report[NLI]["passed"]
    assert not report["sentiment"]["passed"] and report["sentiment"]["max_abs_diff"] > 1e-5


def test_tampered_files_rejected(bundle_copy, capsys):
    for name in ("nli_head.onnx", "weights.data"):
        path = bundle_copy / name
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(BundleError, match=f"{name}.*does not match the manifest"):
            load_manifest(bundle_copy)
        assert cli_main(["verify", str(bundle_copy)]) == 1
        assert name in capsys.readouterr().out
        path.write_bytes(original)


def test_old_format_version_refused(bundle_copy):
    manifest_path = bundle_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError) as err:
        load_manifest(bundle_copy)
    message = str(err.value)
    assert "version 1" in message and f"version {FORMAT_VERSION}" in message
    assert "disan export" in message and "model_export.recover" in message  # says how to rebuild


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


def test_verify_modes(bundle_copy, tiny_checkpoints, monkeypatch, tmp_path):
    """With --checkpoints: parity against them; without: against the PyTorch models rebuilt
    from the bundle's own weights, saying how to get the checkpoint check; without torch:
    internal consistency."""
    from model_export import verify

    result = verify_bundle(bundle_copy, checkpoints=tiny_checkpoints.nli.parent, dev_limit=50)
    assert result["passed"] and result["mode"] == "parity_vs_checkpoints"
    result = verify_bundle(bundle_copy, dev_limit=50)
    assert result["passed"] and result["mode"] == "parity_vs_bundle_weights", result
    assert "--checkpoints PATH" in result["mode_reason"] and "nli.pt" in result["mode_reason"]
    assert set(result["sets"]) == {"cpu", "gpu"} and result["sets"]["gpu"]["fp16"]["meets_bars"]
    with pytest.raises(ValueError, match="no .pt file with sha256"):
        verify_bundle(bundle_copy, checkpoints=tmp_path)
    result = verify_bundle(bundle_copy, dev_limit=50,
                           checkpoints=[tiny_checkpoints.nli, tiny_checkpoints.sentiment])
    assert result["passed"] and result["mode"] == "parity_vs_checkpoints"

    def no_torch(*_):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(verify, "references_from_bundle", no_torch)
    result = verify_bundle(bundle_copy, dev_limit=50)
    assert result["mode"] == "internal_consistency" and "--checkpoints PATH" in result["mode_reason"]
    assert result["passed"], result
    assert "cpu/encoder vs gpu/encoder" in result["consistency"]


def test_verify_rebuilds_models_from_bundle_weights(tiny_bundle, models):
    """The bundle's parameter-named weights give back exactly the exported models."""
    from model_export.verify import models_from_bundle

    for got, want in zip(models_from_bundle(tiny_bundle, load_manifest(tiny_bundle)), models, strict=True):
        for key, value in want.state_dict().items():
            if not key.endswith("trainable_rows"):
                assert torch.equal(got.state_dict()[key], value), key


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
    with pytest.raises(ValueError, match="--sets"):
        build_bundle(tiny_checkpoints.nli, tiny_checkpoints.sentiment, tmp_path / "b", sets=("tpu",))
    assert not (tmp_path / "b").exists()


def test_variant_accuracy_delta_on_labelled_dev_data(tiny_bundle, tmp_path):
    """With --dev-data the manifest can state each variant's accuracy and its delta vs fp32."""
    import gzip

    from disan.text import Vocab
    from model_export.agreement import agreement_data, variant_agreement

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
    data = agreement_data(tmp_path, vocab, 100)
    assert str(tmp_path) not in data["source"]  # named by the staged layout, not this machine
    report = variant_agreement(tiny_bundle, manifest, "gpu", "fp16", data)
    for name, n in ((NLI, 30), ("sentiment", 25)):
        entry = report[name]
        assert entry["n"] == n and 0.0 <= entry["accuracy_fp32"] <= 1.0
        assert entry["accuracy_delta"] == pytest.approx(entry["accuracy"] - entry["accuracy_fp32"])
    assert "accuracy_delta" not in report["encoder"]


def test_write_manifest_rehashes(bundle_copy):
    manifest = load_manifest(bundle_copy)
    (bundle_copy / "vocab.json").write_text((bundle_copy / "vocab.json").read_text() + " ")
    with pytest.raises(BundleError):
        load_manifest(bundle_copy)
    write_manifest(bundle_copy, manifest)
    assert load_manifest(bundle_copy)["files"]["vocab.json"] == sha256_file(bundle_copy / "vocab.json")


@pytest.fixture(scope="module")
def half_bundle(tiny_checkpoints, tmp_path_factory) -> Path:
    """The tiny bundle exported with --embedding-storage fp16."""
    out = tmp_path_factory.mktemp("half") / "bundle"
    build_bundle(tiny_checkpoints.nli, tiny_checkpoints.sentiment, out, fp16=True, int8=True,
                 log=lambda *_: None, embedding_storage="fp16")
    return out


def test_fp16_embedding_storage_halves_the_tables(half_bundle, tiny_bundle, models):
    """The word-vector tables are stored once, in fp16: weights.data shrinks by half their fp32
    bytes, and no graph holds an fp32 copy."""
    m = load_manifest(half_bundle)
    assert m["weights"]["embedding_storage"] == "fp16" and m["verification"]["passed"]
    data = (half_bundle / "weights.data").read_bytes()
    saved = 0
    for model in models:
        table = model.encoder.embed.weight.detach()
        assert data.count(table.half().numpy().tobytes()) == 1
        assert data.count(table.numpy().tobytes()) == 0
        saved += table.numpy().nbytes // 2
    shrink = (tiny_bundle / "weights.data").stat().st_size - len(data)
    assert abs(shrink - saved) <= 2 * 4096, (shrink, saved)  # page alignment of the offsets
    for file in all_files(m):
        graph = onnx.load(str(half_bundle / file), load_external_data=False).graph
        tables = [i for i in graph.initializer if i.name.endswith("encoder.embed.weight")]
        assert not tables, (file, [i.name for i in tables])


def test_fp16_embedding_storage_checked_as_shipped(half_bundle, tiny_checkpoints, models):
    """The graphs compute the checkpoints' models with the tables rounded to fp16: ORT equals that
    model (and not the unrounded one, which verify must round too), and the bundle's weights
    rebuild it exactly."""
    from model_export.verify import models_from_bundle
    from model_export.weights import round_embedding_fp16

    m = load_manifest(half_bundle)
    rounded = []
    for model in models:
        twin = type(model)(model.cfg)
        twin.load_state_dict(model.state_dict())
        round_embedding_fp16(twin.eval())
        rounded.append(twin)
    rebuilt = models_from_bundle(half_bundle, m)
    for got, want in zip(rebuilt, rounded, strict=True):
        assert torch.equal(got.encoder.embed.weight, want.encoder.embed.weight)
    ids, mask = padded(np.random.default_rng(0), models[1].cfg.vocab_size, 4, 9)
    with torch.no_grad():
        want = torch.softmax(rounded[1](torch.from_numpy(ids), torch.from_numpy(mask)), -1).numpy()
        raw = torch.softmax(models[1](torch.from_numpy(ids), torch.from_numpy(mask)), -1).numpy()
    for set_name in ("cpu", "gpu"):
        got = sess(half_bundle / variant_files(m, set_name, "fp32")["sentiment"]).run(
            None, {"ids": ids, "mask": mask})[0]
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        assert np.abs(got - raw).max() > 1e-6  # the rounding is visible: the check above can fail
    result = verify_bundle(half_bundle, checkpoints=tiny_checkpoints.nli.parent, dev_limit=50)
    assert result["passed"] and result["mode"] == "parity_vs_checkpoints", result
    assert verify_bundle(half_bundle, dev_limit=50)["passed"]


def test_fp16_embedding_storage_refuses_out_of_range_tables(models):
    from model_export.weights import round_embedding_fp16

    model = type(models[0])(models[0].cfg)
    with torch.no_grad():
        model.encoder.embed.weight[3, 0] = 1e6
    with pytest.raises(ValueError, match="fp16's range"):
        round_embedding_fp16(model)
