"""model_export.recover: a format-1 bundle's graphs -> the PyTorch models (checkpoints gone)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from disan.manifest import EXPLAIN_OUTPUTS, load_manifest  # noqa: E402
from disan.model import DiSANConfig, build_model  # noqa: E402
from disan.text import Vocab  # noqa: E402
from model_export.graphs import SentimentExplainGraph  # noqa: E402
from model_export.recover import graph_parity, recover, weights_from_graph  # noqa: E402
from model_export.verify import load_state  # noqa: E402
from model_export.weights import rename_values  # noqa: E402

torch.set_num_threads(1)


def test_weights_read_back_from_a_format1_graph(tiny_bundle, tiny_checkpoints, tmp_path):
    """A graph named as format-1 exports left it ("model.<key>" where the exporter kept a
    parameter's name, anonymous "val_N" for the transposed copies), weights inline: the model
    rebuilt from it equals the checkpoint and reproduces the graph."""
    graph = onnx.load(str(tiny_bundle / "sentiment_explain.onnx"))  # external weights read in
    renames = {}
    for k, init in enumerate(graph.graph.initializer):
        key = init.name.removeprefix("sentiment/")
        if key != init.name:
            renames[init.name] = f"val_{1000 + k}" if key.endswith("/T") else f"model.{key}"
    assert any(v.startswith("val_") for v in renames.values())  # the probe path is exercised
    rename_values(graph.graph, renames)
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


def test_recover_refuses_a_current_bundle(tiny_bundle, tmp_path):
    with pytest.raises(ValueError, match="converts version 1"):
        recover(tiny_bundle, tmp_path / "out")
    assert not (tmp_path / "out").exists()
