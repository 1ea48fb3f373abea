"""model_export.graphs.cache: a traced graph is reused only for an identical module."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from conftest import loaded  # noqa: E402

from model_export.graphs import cache as graph_cache  # noqa: E402
from model_export.graphs import wrappers as graphs  # noqa: E402
from model_export.graphs.wrappers import EncoderGraph, NLIHeadGraph, chunked_attention, export_graph  # noqa: E402

V = 40  # the example ids' range (ids past a table read as UNK)


@pytest.fixture
def traces(monkeypatch) -> list[str]:
    """The names of the graphs really traced (not copied from the cache)."""
    seen: list[str] = []
    trace = graphs._trace

    def counting(module, path, vocab_size, opset):
        seen.append(path.name)
        return trace(module, path, vocab_size, opset)

    monkeypatch.setattr(graphs, "_trace", counting)
    return seen


def test_an_identical_module_is_copied_not_traced(tiny_checkpoints, tmp_path, monkeypatch, traces):
    monkeypatch.setenv(graph_cache.CACHE_ENV, str(tmp_path / "cache"))
    head = NLIHeadGraph(loaded(tiny_checkpoints.nli)[0])
    first = export_graph(head, tmp_path / "a.onnx", V)
    again = export_graph(NLIHeadGraph(loaded(tiny_checkpoints.nli)[0]), tmp_path / "b.onnx", V)
    assert traces == ["a.onnx"]
    assert first.read_bytes() == again.read_bytes()
    export_graph(head, tmp_path / "c.onnx", V + 1)  # another example vocabulary: traced again
    assert traces == ["a.onnx", "c.onnx"]


def test_the_key_follows_weights_attributes_and_names(tiny_checkpoints):
    model = loaded(tiny_checkpoints.nli)[0]
    key = graph_cache.graph_key(EncoderGraph(model.encoder, "encoder"), V, 18)
    twin = loaded(tiny_checkpoints.nli)[0]  # the same checkpoint loaded again
    assert key == graph_cache.graph_key(EncoderGraph(twin.encoder, "encoder"), V, 18)
    assert key != graph_cache.graph_key(EncoderGraph(model.encoder, "nli_encoder"), V, 18)
    wrapper = EncoderGraph(model.encoder, "encoder")
    with chunked_attention(wrapper, 1024):  # an attribute, not a weight: the CPU set's graph
        assert graph_cache.graph_key(wrapper, V, 18) != key
    model.encoder.register_buffer("scratch", torch.zeros(2), persistent=False)  # not in state_dict
    with_buffer = graph_cache.graph_key(EncoderGraph(model.encoder, "encoder"), V, 18)
    assert with_buffer != key
    model.encoder.scratch[0] = 1.0
    assert graph_cache.graph_key(EncoderGraph(model.encoder, "encoder"), V, 18) != with_buffer
    with torch.no_grad():
        model.encoder.embed.weight[5, 0] += 1e-3
    assert graph_cache.graph_key(EncoderGraph(model.encoder, "encoder"), V, 18) not in (key, with_buffer)


def test_the_key_names_the_functions_a_module_holds(tiny_checkpoints):
    """Dense keeps its activation as an attribute: two modules that differ only there differ."""
    model = loaded(tiny_checkpoints.nli)[0]
    key = graph_cache.graph_key(NLIHeadGraph(model), V, 18)
    dense = next(m for m in model.modules() if hasattr(m, "act"))
    dense.act = torch.nn.functional.relu if dense.act is not torch.nn.functional.relu else torch.tanh
    assert graph_cache.graph_key(NLIHeadGraph(model), V, 18) != key
    scale = 2.0
    dense.act = lambda t: t * scale  # a closure: what it captured is part of the key
    doubled = graph_cache.graph_key(NLIHeadGraph(model), V, 18)
    scale = 3.0
    assert graph_cache.graph_key(NLIHeadGraph(model), V, 18) != doubled


def test_an_attribute_without_a_stable_form_is_never_cached(tiny_checkpoints, tmp_path, monkeypatch,
                                                            traces):
    monkeypatch.setenv(graph_cache.CACHE_ENV, str(tmp_path / "cache"))
    head = NLIHeadGraph(loaded(tiny_checkpoints.nli)[0])
    head.note = object()  # no repr that says what it holds
    assert graph_cache.graph_key(head, V, 18) is None
    export_graph(head, tmp_path / "a.onnx", V)
    export_graph(head, tmp_path / "b.onnx", V)
    assert traces == ["a.onnx", "b.onnx"] and not (tmp_path / "cache").exists()


def test_off_without_the_variable(tiny_checkpoints, tmp_path, monkeypatch, traces):
    monkeypatch.delenv(graph_cache.CACHE_ENV, raising=False)
    head = NLIHeadGraph(loaded(tiny_checkpoints.nli)[0])
    export_graph(head, tmp_path / "a.onnx", V)
    export_graph(head, tmp_path / "b.onnx", V)
    assert traces == ["a.onnx", "b.onnx"]


def _initializers(path) -> dict:
    import onnx
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def test_a_module_that_differs_only_in_its_table_gets_the_graph_with_its_own_table(
        tiny_checkpoints, tmp_path, monkeypatch, traces):
    """Another --embedding-storage rounds only the tables: the graph is copied, not traced, and holds
    exactly what a trace of the rounded module holds."""
    from model_export.graphs.storage import round_tables

    monkeypatch.setenv(graph_cache.CACHE_ENV, str(tmp_path / "cache"))
    export_graph(EncoderGraph(loaded(tiny_checkpoints.nli)[0].encoder, "encoder"), tmp_path / "a.onnx", V)
    model = loaded(tiny_checkpoints.nli)[0]
    round_tables([model], "int8")
    copied = export_graph(EncoderGraph(model.encoder, "encoder"), tmp_path / "b.onnx", V)
    assert traces == ["a.onnx"]
    monkeypatch.delenv(graph_cache.CACHE_ENV)
    traced = export_graph(EncoderGraph(model.encoder, "encoder"), tmp_path / "c.onnx", V)
    got, want = _initializers(copied), _initializers(traced)
    assert got.keys() == want.keys() and "encoder.embed.weight" in got
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    first = _initializers(tmp_path / "a.onnx")["encoder.embed.weight"]
    assert not np.array_equal(got["encoder.embed.weight"], first)  # the new table, not the cached one


def test_a_table_whose_values_another_tensor_shares_is_kept_with_its_values(tiny_checkpoints, tmp_path,
                                                                             monkeypatch, traces):
    """The exporter merges equal initializers, so replacing the table's could change the other
    tensor's too: such a graph is kept under the key with every value, and a new table is traced."""
    monkeypatch.setenv(graph_cache.CACHE_ENV, str(tmp_path / "cache"))
    model = loaded(tiny_checkpoints.nli)[0]
    model.encoder.register_buffer("twin", model.encoder.embed.weight.detach().clone(), persistent=False)
    graph = EncoderGraph(model.encoder, "encoder")
    assert graph_cache.table_names(graph) == {"encoder.embed.weight"}
    export_graph(graph, tmp_path / "a.onnx", V)
    assert not graph_cache.holds_tables_verbatim(tmp_path / "a.onnx", graph, {"encoder.embed.weight"})
    with torch.no_grad():
        model.encoder.embed.weight[5, 0] += 1e-3
    export_graph(graph, tmp_path / "b.onnx", V)
    assert traces == ["a.onnx", "b.onnx"]
