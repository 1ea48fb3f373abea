"""--embedding-storage int8+int4:N: a table's last N rows (its rarest words) stored in per-row int4,
read by the graphs exactly as rounded, checked at export and by `disan verify`, read back by
recover."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import loaded
from test_export_embed import TEXTS, _runtime, embed_ckpt, encode  # noqa: F401 (a fixture)

from disan.bundle.manifest import int4_rows, load_manifest, storage_kind
from disan.text.tokenizer import Vocab

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from disan import Encoder  # noqa: E402
from model_export.embed import reindexed  # noqa: E402
from model_export.export import ExportConfig, build_bundle, storage_by_model  # noqa: E402
from model_export.graphs.int4_tail import dequantize_rows_int4, quantize_rows_int4  # noqa: E402
from model_export.graphs.storage import quantize_rows, store_tables, stored_rows  # noqa: E402
from model_export.references import bundle_models  # noqa: E402
from model_export.verify import verify_bundle  # noqa: E402

TAIL = 5


def test_int4_rows_round_trip_within_half_a_step():
    rows = np.random.default_rng(0).normal(size=(6, 7)).astype(np.float32)  # an odd width
    rows[2] = 0.0
    packed, scale = quantize_rows_int4(rows)
    assert packed.dtype == np.uint8 and packed.shape == (6, 4)  # two values a byte
    back = dequantize_rows_int4(packed, scale, 7)
    assert np.all(back[2] == 0) and np.all(np.abs(back - rows) <= scale / 2 + 1e-6)
    assert np.allclose(np.abs(back).max(1), np.abs(rows).max(1))  # the largest value is exact
    np.testing.assert_array_equal(dequantize_rows_int4(*quantize_rows_int4(back), 7), back)  # idempotent


def test_storage_names():
    assert storage_kind("int8+int4:120") == "int8+int4:N" and int4_rows("int8+int4:120") == 120
    assert int4_rows("int8") == 0 and storage_kind("int8+int4:0") == "int8+int4:0"
    by_model = storage_by_model("int8,embed=int8+int4:9", ["nli", "embed"])
    assert by_model == {"nli": "int8", "embed": "int8+int4:9"}
    for bad in ("int8+int4:0", "int8+int4:x", "int4"):
        with pytest.raises(ValueError, match="storages are"):
            storage_by_model(f"embed={bad}", ["embed"])
    with pytest.raises(ValueError, match="give 1 to 3"):
        stored_rows(np.ones((4, 2), np.float32), 4)


def _table_graph(table: np.ndarray) -> onnx.ModelProto:
    """ids -> (Gather of the table, the table cast to fp16 whole): the two ways graphs read it."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0, name="lookup"),
         helper.make_node("Cast", ["table"], ["half"], to=TensorProto.FLOAT16, name="to_half")],
        "t", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["b", "t", table.shape[1]]),
         helper.make_tensor_value_info("half", TensorProto.FLOAT16, list(table.shape))],
        [numpy_helper.from_array(table, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("dim", [6, 7])
def test_the_graph_reads_both_parts_as_rounded(dim):
    table = np.random.default_rng(1).normal(size=(12, dim)).astype(np.float32)
    table[0] = 0.0  # PAD
    table = stored_rows(table, TAIL)[1]  # rounded as the export rounds it
    model = _table_graph(table)
    assert store_tables(model, {"table"}, f"int8+int4:{TAIL}") == 1
    onnx.checker.check_model(model, full_check=True)
    stored = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert set(stored) == {"table/int8", "table/scale", "table/int4", "table/scale4"}
    assert stored["table/int8"].shape == (12 - TAIL, dim)
    assert stored["table/int4"].shape == (TAIL, (dim + 1) // 2)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[0, 6, 7, 11], [11, 1, 6, 7]])  # both sides of the split, and its ends
    rows, half = session.run(None, {"ids": ids})
    np.testing.assert_array_equal(rows, table[ids])
    np.testing.assert_array_equal(half, table.astype(np.float16))


def test_unrounded_values_are_refused():
    table = np.random.default_rng(2).normal(size=(8, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="not rounded"):
        store_tables(_table_graph(table), {"table"}, "int8+int4:3")


@pytest.fixture(scope="module")
def int4_bundle(tmp_path_factory, tiny_checkpoints, embed_ckpt) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("embed-int4") / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, out, embed=embed_ckpt,
                              embedding_storage=f"int8,nli=fp16,embed=int8+int4:{TAIL}"), log=lambda *_: None)
    return out


def test_a_bundle_with_an_int4_tail_serves_and_verifies_as_rounded(int4_bundle, embed_ckpt,  # noqa: F811
                                                                   tiny_checkpoints):
    m = load_manifest(int4_bundle)
    assert m["weights"]["embedding_storage"]["embed"] == f"int8+int4:{TAIL}"
    assert f"last {TAIL} rows" in m["weights"]["note"] and m["verification"]["passed"]
    own, own_vocab = loaded(embed_ckpt)
    vocab = Vocab.load(int4_bundle / "vocab.json")
    ids = torch.tensor([own_vocab.stoi.get(w, 1) for w in vocab.itos])
    table = own.embed.weight.detach()[ids].numpy()
    want_table = stored_rows(table, TAIL)[1]
    assert not np.array_equal(want_table, stored_rows(table)[1])  # int4 differs from int8: visible
    # the graphs hold the int4 codes of those rows and int8 codes of the others, and read them back
    graph = onnx.load(str(int4_bundle / "encoder.onnx")).graph
    codes = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    np.testing.assert_array_equal(codes["embed/embed.weight/int4"], quantize_rows_int4(table[-TAIL:])[0])
    np.testing.assert_array_equal(codes["embed/embed.weight/int8"], quantize_rows(table[:-TAIL])[0])
    rebuilt = bundle_models(int4_bundle, m)
    np.testing.assert_array_equal(rebuilt["embed"].embed.weight.detach().numpy(), want_table)
    reference = reindexed(own, own_vocab, vocab)  # the bundle's order, rows as stored
    with torch.no_grad():
        reference.embed.weight[:] = torch.from_numpy(want_table)
    want = encode(reference, vocab, TEXTS)
    for graph_set in ("cpu", "gpu"):
        got = Encoder(runtime=_runtime(int4_bundle, graph_set, "fp32")).encode(TEXTS)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=graph_set)
    places = [tiny_checkpoints.nli, tiny_checkpoints.sentiment, embed_ckpt]
    assert verify_bundle(int4_bundle, checkpoints=places, dev_limit=20)["passed"]
