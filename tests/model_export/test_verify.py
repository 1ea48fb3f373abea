"""Bundle verification: parity checks that can fail, tampered or old bundles refused, the verify
modes, variant agreement on labelled dev data, manifests rehashed."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")  # model_export reads graphs with onnx, runs them with onnxruntime
pytest.importorskip("onnxruntime")

from disan.bundle.manifest import (  # noqa: E402
    FORMAT_VERSION,
    BundleError,
    load_manifest,
    sha256_file,
    variant_files,
    write_manifest,
)
from disan.cli import main as cli_main  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model_export.agreement import NLI  # noqa: E402
from model_export.references import references_from_models  # noqa: E402
from model_export.verify import check_parity, verify_bundle  # noqa: E402

torch.set_num_threads(1)


def test_parity_check_can_fail(tiny_bundle, tiny_checkpoints, tiny_models):
    """The verifier must notice a graph that does not match its model."""
    sent, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.sentiment))
    with torch.no_grad():
        sent.out.linear.bias[0] += 0.5  # a different sentiment model (one class logit moved)
    m = load_manifest(tiny_bundle)
    refs = references_from_models(tiny_models[0], sent)
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


def test_graphs_that_name_the_build_machine_fail(bundle_copy, capsys):
    """A graph whose nodes still carry the exporter's metadata (the Python stack with the build
    machine's paths, as bundles exported before the export dropped it) fails `disan verify`."""
    import onnx

    manifest = load_manifest(bundle_copy)
    path = bundle_copy / "sentiment.onnx"
    model = onnx.load(str(path), load_external_data=False)
    entry = model.graph.node[0].metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.stack_trace", 'File "/home/builder/disan/model.py", line 1'
    onnx.save(model, str(path))
    write_manifest(bundle_copy, manifest)  # rehash: the bundle is otherwise valid
    result = verify_bundle(bundle_copy, dev_limit=20)
    assert not result["passed"] and result["exporter_metadata"]["files"] == ["sentiment.onnx"]
    assert cli_main(["verify", str(bundle_copy)]) == 1
    assert "export the bundle again" in capsys.readouterr().out


def test_a_recorded_route_fingerprint_that_the_files_do_not_compute_fails(bundle_copy):
    manifest = load_manifest(bundle_copy)
    assert verify_bundle(bundle_copy, dev_limit=20)["route_fingerprints"] == {"checked": True, "stale": []}
    manifest["route_fingerprints"]["embed"]["cpu/fp32"] = "0" * 64
    write_manifest(bundle_copy, manifest)
    result = verify_bundle(bundle_copy, dev_limit=20)
    assert not result["passed"] and result["route_fingerprints"]["stale"] == ["embed"]


def test_fingerprints_recorded_by_an_export_that_hashed_the_vocabulary_bytes_still_verify(bundle_copy):
    from model_export.bundle_diff import route_fingerprints  # onnx, as verify's check

    manifest = load_manifest(bundle_copy)
    manifest["route_fingerprints"] = route_fingerprints(bundle_copy, manifest, vocab_as_bytes=True)
    assert manifest["route_fingerprints"] != route_fingerprints(bundle_copy, manifest)
    write_manifest(bundle_copy, manifest)
    check = verify_bundle(bundle_copy, dev_limit=20)["route_fingerprints"]
    assert check["stale"] == [] and "before 2026-12-06" in check["rule"]
    manifest["route_fingerprints"]["nli"]["cpu/fp32"] = "0" * 64  # neither rule computes this
    write_manifest(bundle_copy, manifest)
    assert verify_bundle(bundle_copy, dev_limit=20)["route_fingerprints"]["stale"] == ["nli"]


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


def test_verify_rebuilds_models_from_bundle_weights(tiny_bundle, tiny_models):
    """The bundle's parameter-named weights give back exactly the exported models."""
    from model_export.references import bundle_models

    models = bundle_models(tiny_bundle, load_manifest(tiny_bundle))
    rebuilt = [models["nli"], models["sentiment"]]
    for got, want in zip(rebuilt, tiny_models, strict=True):
        for key, value in want.state_dict().items():
            if not key.endswith("trainable_rows"):
                assert torch.equal(got.state_dict()[key], value), key


def test_variant_accuracy_delta_on_labelled_dev_data(tiny_bundle, tmp_path):
    """With --dev-data the manifest can state each variant's accuracy and its delta vs fp32."""
    import gzip

    from disan.text.tokenizer import Vocab
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




def test_served_accuracy_is_measured_on_the_bundle_as_served(tiny_bundle, tmp_path, monkeypatch):
    """Export records the bundle's own test accuracy (its tokenizer and graphs), per staged set."""
    import gzip

    from disan.eval.evaluate import evaluate_task
    from model_export.served import served_accuracy

    (tmp_path / "sst").mkdir()
    with gzip.open(tmp_path / "sst" / "sst5_test.jsonl.gz", "wt") as fh:
        for i in range(40):
            text = "a good movie " * (i % 4 + 1) + "bad" * (i % 2)
            fh.write(json.dumps({"text": text, "label": i % 5}) + "\n")
    (tmp_path / "snli").mkdir()
    with gzip.open(tmp_path / "snli" / "test_tok.jsonl.gz", "wt") as fh:
        for i in range(12):
            fh.write(json.dumps({"sentence1": "a man plays", "sentence2": "a man " + "runs" * (i % 2),
                                 "gold_label": ["entailment", "neutral", "contradiction"][i % 3]}) + "\n")
    from disan.eval import evaluate as evaluate_module
    from disan.runtime import runtime as runtime_module
    loads = []
    real_load = runtime_module.load_offline
    counted = lambda *a, **k: loads.append(a) or real_load(*a, **k)  # noqa: E731
    monkeypatch.setattr(runtime_module, "load_offline", counted)
    monkeypatch.setattr(evaluate_module, "load_offline", counted)
    logged = []
    served = served_accuracy(tiny_bundle, tmp_path, logged.append)
    assert len(loads) == 1  # the bundle is loaded once for every task, not once per task
    assert list(served) == ["snli", "sst5"]  # SST-2 is not staged here: skipped, not failed
    want = evaluate_task(tiny_bundle, "sst5", tmp_path)
    assert served["sst5"] == {"accuracy": want["accuracy"], "macro_f1": want["macro_f1"], "n": 40,
                              "data": "sst/sst5_test.jsonl.gz"}  # the staged layout, no machine path
    assert logged and "sst5" in logged[1]
