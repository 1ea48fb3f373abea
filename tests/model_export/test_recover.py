"""model_export.recover: a bundle's graphs (format 1 or 2) -> the PyTorch models (checkpoints gone)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan.bundle.manifest import (  # noqa: E402
    EXPLAIN_OUTPUTS,
    load_manifest,
    sha256_file,
    variant_files,
    write_manifest,
)
from disan.model import DiSANConfig, build_model  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model_export.graphs.weights import rename_values  # noqa: E402
from model_export.graphs.wrappers import SentimentExplainGraph  # noqa: E402
from model_export.recover import graph_parity, recover, weights_from_graph  # noqa: E402
from model_export.references import load_state  # noqa: E402
from model_export.sessions import session  # noqa: E402
from model_export.verify import parity_cases  # noqa: E402

torch.set_num_threads(1)


def drop_unk_mapping(graph) -> None:
    """Remove the UNK mapping of out-of-table ids (Less + Where before the embedding Gather),
    which graphs exported before it lack: the Gather reads the ids as they come."""
    where = next(n for n in graph.node if n.op_type == "Where" and "ids" in n.input)
    less = next(n for n in graph.node if n.output[0] == where.input[0])
    for node in graph.node:
        node.input[:] = ["ids" if x == where.output[0] else x for x in node.input]
    graph.node.remove(where)
    graph.node.remove(less)


@pytest.mark.parametrize("older_export", [False, True], ids=["today", "without-unk-mapping"])
def test_weights_read_back_from_a_format1_graph(tiny_bundle, tiny_checkpoints, tmp_path, older_export):
    """A graph named as format-1 exports left it ("model.<key>" where the exporter kept a
    parameter's name, anonymous "val_N" for the transposed copies), weights inline: the model
    rebuilt from it equals the checkpoint and reproduces the graph, also when today's probe
    export has nodes the old graph lacks (the use sites are aligned, not taken by position)."""
    graph = onnx.load(str(tiny_bundle / "sentiment_explain.onnx"))  # external weights read in
    renames = {}
    for k, init in enumerate(graph.graph.initializer):
        key = init.name.removeprefix("sentiment/")
        if key != init.name:
            renames[init.name] = f"val_{1000 + k}" if key.endswith("/T") else f"model.{key}"
    assert any(v.startswith("val_") for v in renames.values())  # the probe path is exercised
    rename_values(graph.graph, renames)
    if older_export:
        drop_unk_mapping(graph.graph)
    path = tmp_path / "sentiment.onnx"
    onnx.save(graph, str(path))
    cfg = DiSANConfig.from_dict(load_manifest(tiny_bundle)["models"]["sentiment"]["config"])
    model = load_state(build_model(cfg), weights_from_graph(path, "sentiment", cfg, list(EXPLAIN_OUTPUTS), 0),
                       "sentiment")
    want = model_from_checkpoint(load_checkpoint(tiny_checkpoints.sentiment))[0]
    for key, value in want.state_dict().items():
        if not key.endswith("trainable_rows"):
            assert torch.equal(model.state_dict()[key], value), key
    vocab = Vocab.load(tiny_bundle / "vocab.json")
    assert graph_parity(path, SentimentExplainGraph(model).eval(), vocab, 128) <= 1e-5


def test_recover_rebuilds_a_format2_bundle(tiny_bundle, tiny_checkpoints, tmp_path):
    """A format-2 bundle's parameter-named weights give back checkpoints equal to its sources
    (vocab, labels, metrics, every parameter), which compute what the bundle's graphs compute."""
    manifest = load_manifest(tiny_bundle)
    written = recover(tiny_bundle, tmp_path / "out", log=lambda *_: None)
    assert set(written) == {"nli", "sentiment"}
    vocab = Vocab.load(tiny_bundle / "vocab.json")
    for task, path in written.items():
        payload = load_checkpoint(path)
        got, got_vocab, labels = model_from_checkpoint(payload)
        want = model_from_checkpoint(load_checkpoint(getattr(tiny_checkpoints, task)))[0]
        for key, value in want.state_dict().items():
            if not key.endswith("trainable_rows"):
                assert torch.equal(got.state_dict()[key], value), (task, key)
        assert got_vocab == tiny_checkpoints.vocab and labels == manifest["models"][task]["labels"]
        assert payload["metrics"] == manifest["models"][task]["metrics"]
        origin = payload["recovered_from"]
        assert origin["bundle_format_version"] == 2 and origin["max_abs_diff_vs_graphs"] <= 1e-5
        assert origin["original_checkpoint"]["sha256"] == sha256_file(getattr(tiny_checkpoints, task))
        assert origin["graphs"]
        assert all(f.startswith("sentiment") == (task == "sentiment") for f in origin["graphs"])
        assert str(tiny_checkpoints.nli.parent) not in json.dumps(origin)  # file names, never paths
    sent = model_from_checkpoint(load_checkpoint(written["sentiment"]))[0]
    case = parity_cases(vocab, 16)[-1]
    graph = session(tiny_bundle / variant_files(manifest, "cpu", "fp32")["sentiment"])
    with torch.no_grad():
        want = torch.softmax(sent(torch.from_numpy(case.ids), torch.from_numpy(case.mask)), -1).numpy()
    np.testing.assert_allclose(graph.run(None, {"ids": case.ids, "mask": case.mask})[0], want, atol=1e-5)


def test_recover_writes_nothing_unless_every_model_reproduces_its_graphs(tiny_bundle, tmp_path):
    """A manifest whose sentiment config disagrees with its graphs (another c): the rebuilt
    model computes something else, so no checkpoint is written, not even the NLI one."""
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = load_manifest(bundle)
    manifest["models"]["sentiment"]["config"]["c"] = 2.0
    write_manifest(bundle, manifest)
    with pytest.raises(ValueError, match="do not reproduce.*sentiment"):
        recover(bundle, tmp_path / "out", log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_recover_refuses_an_unknown_format(tiny_bundle, tmp_path):
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["format_version"] = 3
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="reads versions 1 and 2"):
        recover(bundle, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_later_generations_keep_the_whole_provenance(tiny_bundle, tiny_checkpoints, tmp_path):
    """Recover a bundle, export the recovered models again, and again: each manifest names every
    checkpoint once (a source's history is references into `lineage`, not copies), and the
    checkpoints recovered last still carry the whole chain back to the first sources."""
    from model_export.export import ExportConfig, build_bundle

    bundle, made = tiny_bundle, {t: getattr(tiny_checkpoints, t) for t in ("nli", "sentiment")}
    for generation in (1, 2):
        recovered = recover(bundle, tmp_path / f"r{generation}", log=lambda *_: None)
        bundle = tmp_path / f"b{generation}"
        build_bundle(ExportConfig(recovered["nli"], recovered["sentiment"], bundle, max_len=128, fp16=False,
                                  int8=False, name="tiny-disan"), log=lambda *_: None)
        manifest = load_manifest(bundle)
        for task in ("nli", "sentiment"):
            source = manifest["sources"][task]
            assert source["sha256"] == sha256_file(recovered[task])
            original = source["recovered_from"]["original_checkpoint"]
            assert original == {"file": f"{task}.pt", "sha256": sha256_file(made[task])}
            if generation == 2:  # the checkpoint it came from has a history: stored once, apart
                assert manifest["lineage"][original["sha256"]]["recovered_from"]
        assert str(tmp_path) not in json.dumps(manifest)  # file names, never paths
        made = recovered

    last = recover(bundle, tmp_path / "r3", log=lambda *_: None)
    for task, path in last.items():
        origin = load_checkpoint(path)["recovered_from"]["original_checkpoint"]
        history = load_checkpoint(made[task])["recovered_from"]
        assert origin == {"file": f"{task}.pt", "sha256": sha256_file(made[task]), "recovered_from": history}
        assert history["original_checkpoint"]["recovered_from"]["original_checkpoint"]["sha256"] == \
            sha256_file(getattr(tiny_checkpoints, task))
