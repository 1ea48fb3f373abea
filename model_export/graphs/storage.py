"""How the bundle stores a model's parameters, and reads them back.

The word-vector tables, most of a bundle's bytes, may be stored in fp16, as per-row int8 with
fp32 scales, or so with their rarest rows in int4 (`model_export.graphs.int4_tail`), and the other
parameters in fp16 (`store_tables`); the models are rounded to those
values first (`round_tables`, `round_matrices`) so that the parity check sees what ships.
`state_dicts_from_graphs` reads the parameter-named initializers back as the fp32 values the
graphs serve.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from disan.bundle.manifest import EMBEDDING_STORAGES, INT4_TAIL, MATRIX_STORAGES, int4_rows, storage_kind
from disan.model import BORROWED_KEY
from model_export.graphs.int4_tail import (
    INT4_SCALE,
    INT4_STORED,
    dequantize_rows_int4,
    gathered_to_fp32,
    quantize_rows_int4,
    whole_to_fp32,
)
from model_export.graphs.weights import (
    EXTERNAL_MIN_BYTES,
    TRANSPOSED,
    nested_graphs,
    subgraphs,
    tensor_nbytes,
)

HALF_STORED = "/half"  # an fp32 parameter kept on disk in fp16 (see store_tables)
INT8_STORED, INT8_SCALE = "/int8", "/scale"  # per-row int8 and its fp32 scales (store_tables)
EMBEDDING = "encoder.embed.weight"  # the word-vector table: most of a model's bytes
# ... of a bare encoder (the distilled one, task "embed": a DiSANEncoder, no "encoder." prefix)
TABLE_KEYS = {"embed": "embed.weight"}
FP16_MAX = 65504.0
INT8_MAX = 127  # symmetric: -127..127, so the scale maps a row's largest |value| to exactly 127
MATRIX_NOTE = ("the other parameters of {models} stored in fp16 (`/half`), each cast back to fp32 "
               "once (onnxruntime folds the cast when the session loads)")
STORAGE_NOTES = {
    "fp32": "word-vector tables stored in fp32",
    "fp16": "word-vector tables stored in fp16 (`/half`), cast back to fp32 rows after the Gather",
    "int8": "word-vector tables stored as per-row symmetric int8 (`/int8`) with an fp32 scale per "
            "row (`/scale`): each gathered row is Cast to fp32 and multiplied by its scale (a "
            "reader of the whole table, the fp16 variant's cast, dequantises it once; onnxruntime "
            "folds that at session load)",
    INT4_TAIL + "N": "word-vector tables stored as per-row int8 but for their last {rows} rows (the rarest "
                     "words), stored as per-row symmetric int4, two values a byte (`/int4`), with an "
                     "fp32 scale per row (`/scale4`): a Gather reads each part and picks by id",
}


# The storage key ({model: storage}) of the word table task models borrowed, where the bundle's
# encoder reads subword pieces and so cannot lend its own: the models keep their copy, stored once.
BORROWED = "borrowed"
# that table's key in a bare encoder (`disan distill whole-words`), not under a task model's `encoder.`
ENCODER_BORROWED_KEY = BORROWED_KEY.rsplit(".", 1)[-1]


def table_name(task: str) -> str:
    """The initializer name of `task`'s word-vector table."""
    return f"{task}/{TABLE_KEYS.get(task, EMBEDDING)}"


def table_storages(storage: dict[str, str]) -> dict[str, str]:
    """{initializer name: storage} of the word-vector tables, from {model: storage}: each model's
    own table, and a task model's borrowed copy of the encoder's table in the encoder's storage,
    so that both are the same bytes and the shared weights file holds them once."""
    names = {table_name(task): kind for task, kind in storage.items() if task != BORROWED}
    lent = storage.get(BORROWED, storage.get("embed"))  # BORROWED: kept beside a piece encoder
    if lent is not None:
        names |= {f"{task}/{BORROWED_KEY}": lent for task in storage if task not in ("embed", BORROWED)}
    if BORROWED in storage:  # a piece encoder that reads whole words reads the same table
        names[f"embed/{ENCODER_BORROWED_KEY}"] = storage[BORROWED]
    return names


def word_table(model):
    """A model's word-vector table parameter (an NLI/sentiment model's encoder's, or a bare encoder's)."""
    return getattr(model, "encoder", model).embed.weight


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric int8: (q int8 [V,d], scale float32 [V,1]) with q = rint(row / scale) and
    scale = max|row| / 127 (1 for an all-zero row, the PAD row, which stays exactly zero)."""
    table = np.asarray(table, dtype=np.float32)
    scale = (np.abs(table).max(axis=1, keepdims=True) / np.float32(INT8_MAX)).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(table / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The fp32 values an int8-stored table serves: q * scale in fp32, as the graphs' Cast + Mul."""
    return q.astype(np.float32) * scale.astype(np.float32)


def round_tables(models, storage: str) -> None:
    """Round each model's word-vector table to the values `storage` keeps, in place (still fp32):
    the bundle holds exactly these, so the PyTorch reference of the parity check and the graphs
    compute the same model. fp32: unchanged."""
    for model in models:
        round_table(word_table(model).data, storage, model.cfg.task)


def round_table(table, storage: str, owner: str) -> None:
    """Round one word-vector table (an fp32 tensor: a model's own, or a task model's borrowed copy
    of the encoder's) to the values `storage` keeps, in place. fp32: unchanged. `owner` names the
    model in an error."""
    if storage == "fp16":
        if float(table.abs().max()) > FP16_MAX:
            raise ValueError(f"{owner}: word vectors beyond fp16's range ({FP16_MAX}); "
                             "export with --embedding-storage fp32")
        table.copy_(table.half().float())
    elif storage_kind(storage) in ("int8", INT4_TAIL + "N"):
        table.copy_(torch_from(stored_rows(table.cpu().numpy(), int4_rows(storage))[1]))
    elif storage != "fp32":
        raise ValueError(f"embedding storage: one of {', '.join(EMBEDDING_STORAGES)}, got {storage!r}")


def stored_rows(table: np.ndarray, tail: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """(the arrays an int8 table is stored as, with its last `tail` rows in int4 when tail > 0:
    int8 codes and scales, then int4 codes and scales; the fp32 values they serve)."""
    if tail == 0:
        q, scale = quantize_rows(table)
        return [q, scale], dequantize_rows(q, scale)
    if not 1 <= tail < len(table):
        raise ValueError(f"{INT4_TAIL}{tail}: a table of {len(table)} rows; give 1 to {len(table) - 1} "
                         "rows (the first rows, PAD and UNK among them, stay int8)")
    first = len(table) - tail
    q8, s8 = quantize_rows(table[:first])
    q4, s4 = quantize_rows_int4(table[first:])
    back = np.vstack([dequantize_rows(q8, s8), dequantize_rows_int4(q4, s4, table.shape[1])])
    return [q8, s8, q4, s4], back


def round_matrices(model, storage: str) -> None:
    """Round every floating parameter of `model` other than its word-vector tables (its own and a
    borrowed one: their storage is round_tables') to the values `storage` keeps, in place (still
    fp32), as round_tables does for the tables. fp32: unchanged."""
    if storage not in MATRIX_STORAGES:
        raise ValueError(f"matrix storage: one of {', '.join(MATRIX_STORAGES)}, got {storage!r}")
    if storage == "fp32":
        return
    encoder = getattr(model, "encoder", model)
    tables = {word_table(model).data_ptr()} | (
        {encoder.borrowed.data_ptr()} if getattr(encoder, "borrowed", None) is not None else set())
    for name, value in model.state_dict().items():
        if not value.is_floating_point() or value.data_ptr() in tables:
            continue
        if value.numel() and float(value.abs().max()) > FP16_MAX:
            raise ValueError(f"{model.cfg.task}: {name} beyond fp16's range ({FP16_MAX}); "
                             "export with --matrix-storage fp32")
        value.copy_(value.half().float())


def matrices_of(model: onnx.ModelProto, tasks: Iterable[str], tables: Iterable[str]) -> set[str]:
    """The fp32 initializers of `tasks`' parameters that the weights file holds (1 KiB or more),
    other than the word-vector tables `tables`: what --matrix-storage fp16 stores in fp16."""
    prefixes = tuple(f"{task}/" for task in tasks)
    skip = set(tables)
    return {init.name for init in model.graph.initializer
            if init.data_type == TensorProto.FLOAT and init.name.startswith(prefixes)
            and init.name not in skip and tensor_nbytes(init) >= EXTERNAL_MIN_BYTES}


def torch_from(arr: np.ndarray):
    import torch  # the rounding runs where the models are: with torch (export, verify)

    return torch.from_numpy(np.ascontiguousarray(arr))


def store_tables(model: onnx.ModelProto, names: set[str], storage: str) -> int:
    """Keep the fp32 initializers `names` (word-vector tables; with fp16, any parameter) on disk in
    fp16, int8, or int8 with the last rows in int4 ("int8+int4:N", `model_export.graphs.int4_tail`).

    A Gather of a table reads the stored form and converts only the rows it took back to fp32
    (fp16: a Cast; int8: a Cast and a Mul by the rows' scales, gathered alike), so the running
    graph holds the table in its stored form too; any other reader (the fp16 variant's Cast to
    fp16) reads it through one conversion of the whole table, which onnxruntime folds when the
    session loads. The values must already be those the storage keeps (round_tables): checked,
    so the graph equals the reference it was verified against. Returns how many tables.
    """
    graph = model.graph
    tables = {init.name: init for init in graph.initializer
              if init.name in names and init.data_type == TensorProto.FLOAT}
    if not tables or storage == "fp32":
        return 0
    stored: dict[str, list] = {}
    for name, init in tables.items():
        arr = numpy_helper.to_array(init)
        if storage == "fp16":
            stored[name] = [numpy_helper.from_array(arr.astype(np.float16), name + HALF_STORED)]
            back = arr.astype(np.float16).astype(np.float32)
        else:  # int8, or int8 with an int4 tail
            parts, back = stored_rows(arr, int4_rows(storage))
            suffixes = (INT8_STORED, INT8_SCALE, INT4_STORED, INT4_SCALE)
            stored[name] = [numpy_helper.from_array(a, name + s)
                            for a, s in zip(parts, suffixes, strict=False)]
        if not np.array_equal(back, arr):
            raise ValueError(f"{name}: not rounded to {storage} before export (round_tables, "
                             "round_matrices); the "
                             "bundle would not be the model it was checked against")

    nodes, whole = [], {}
    for node in graph.node:
        table = node.input[0] if node.input else None
        if node.op_type == "Gather" and table in tables:
            nodes += _to_fp32(table, storage, node.output[0], node, tuple(tables[table].dims))
            continue
        for x in node.input:
            if x in tables and x not in whole:
                whole[x] = _to_fp32(x, storage, x, shape=tuple(tables[x].dims))
        nodes.append(node)
    for node in (n for sub in nested_graphs(graph.node) for n in sub.node):
        # a Scan body (the chunked cpu graphs) reads an outer-scope tensor whole, by its name
        for x in node.input:
            if x in tables and x not in whole:
                whole[x] = _to_fp32(x, storage, x, shape=tuple(tables[x].dims))
    kept = [init for init in graph.initializer if init.name not in tables]
    for name in tables:
        kept += stored[name]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    graph.node.extend([n for ns in whole.values() for n in ns] + nodes)
    return len(tables)


def _to_fp32(table: str, storage: str, out: str, gather: onnx.NodeProto | None = None,
             shape: tuple[int, ...] = ()) -> list:
    """Nodes computing fp32 `out` from `table`'s stored form (its fp32 `shape`): the rows the node
    `gather` takes (the same Gather on the stored tensors), or the whole table."""
    if int4_rows(storage):
        first, dim = shape[0] - int4_rows(storage), shape[1]
        int8, int4 = (table + INT8_STORED, table + INT8_SCALE), (table + INT4_STORED, table + INT4_SCALE)
        if gather is None:
            return whole_to_fp32(int8, int4, dim, out, f"{table}/int4_tail")
        if any(a.name == "axis" and a.i != 0 for a in gather.attribute):
            raise ValueError(f"{table}: an int4 tail is read by Gathers of rows (axis 0) only")
        return gathered_to_fp32(int8, int4, first, dim, gather)
    def read(suffix: str) -> tuple[list, str]:
        if gather is None:
            return [], table + suffix
        rows = gather.output[0] + suffix
        attrs = {a.name: helper.get_attribute_value(a) for a in gather.attribute}
        return [helper.make_node("Gather", [table + suffix, *gather.input[1:]], [rows],
                                 name=gather.name + suffix, **attrs)], rows

    prefix = gather.name if gather is not None else table
    if storage == "fp16":
        nodes, half = read(HALF_STORED)
        return [*nodes, helper.make_node("Cast", [half], [out], to=TensorProto.FLOAT,
                                         name=f"{prefix}/to_fp32")]
    nodes, q = read(INT8_STORED)
    more, scale = read(INT8_SCALE)
    wide = f"{out}/int8_as_fp32"
    return [*nodes, *more,
            helper.make_node("Cast", [q], [wide], to=TensorProto.FLOAT, name=f"{prefix}/to_fp32"),
            helper.make_node("Mul", [wide, scale], [out], name=f"{prefix}/scaled")]



def state_dicts_from_graphs(paths: Iterable[Path], aliases: dict[str, str] | None = None
                            ) -> dict[str, dict[str, np.ndarray]]:
    """{task: {state-dict key: array}} from the parameter-named initializers of fp32 graphs (a
    table stored in fp16, int8 or int8 with an int4 tail read back as the fp32 values it serves),
    parameters merged into an equal one read through `aliases` (see name_by_parameters)."""
    found: dict[str, dict[str, np.ndarray]] = {}
    for path in paths:
        model = onnx.load(str(path))  # loads external data from the graph's directory
        for graph in subgraphs(model.graph):
            inits = {init.name: init for init in graph.initializer}
            for init in graph.initializer:
                half = init.data_type == TensorProto.FLOAT16 and init.name.endswith(HALF_STORED)
                quarter = init.data_type == TensorProto.INT8 and init.name.endswith(INT8_STORED)
                if ("/" not in init.name or init.name.endswith((INT8_SCALE, INT4_SCALE))
                        or not (init.data_type == TensorProto.FLOAT or half or quarter)):
                    continue
                task, key = init.name.removesuffix(HALF_STORED).removesuffix(INT8_STORED).split("/", 1)
                arr = numpy_helper.to_array(init).astype(np.float32)
                if quarter:
                    scale = inits[init.name.removesuffix(INT8_STORED) + INT8_SCALE]
                    arr = dequantize_rows(numpy_helper.to_array(init), numpy_helper.to_array(scale))
                    base = init.name.removesuffix(INT8_STORED)
                    if base + INT4_STORED in inits:  # int8 with an int4 tail: the tail follows
                        tail = (numpy_helper.to_array(inits[base + s]) for s in (INT4_STORED, INT4_SCALE))
                        arr = np.vstack([arr, dequantize_rows_int4(*tail, arr.shape[1])])
                if key.endswith(TRANSPOSED):
                    key, arr = key.removesuffix(TRANSPOSED), arr.T
                found.setdefault(task, {})[key] = np.ascontiguousarray(arr)
    for alias, source in (aliases or {}).items():
        (task, key), (_, src) = alias.split("/", 1), source.split("/", 1)
        value = found.get(task, {}).get(src.removesuffix(TRANSPOSED))
        if value is not None and key.removesuffix(TRANSPOSED) not in found[task]:
            # both names are taken from the same kind of match, so transposes cancel out
            flip = key.endswith(TRANSPOSED) != src.endswith(TRANSPOSED)
            found[task][key.removesuffix(TRANSPOSED)] = np.ascontiguousarray(value.T if flip else value)
    return found
