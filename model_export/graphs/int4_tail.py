"""A word-vector table whose rarest rows are stored in int4 (`--embedding-storage int8+int4:N`).

A distilled encoder's vocabulary ends with words it never trained on, each row a linear map of a
static word vector (`disan extend-vocab`); those rows lose nothing measurable in per-row int4
(docs/distillation.md), and at half the bytes of int8 the bundle holds far more of them. The
table is split at row K = V - N: rows [0, K) are per-row int8 as before (`/int8`, `/scale`),
rows [K, V) per-row symmetric int4 (values -7..7, stored +8, two a byte: the even column in the
low nibble) in `/int4` with fp32 scales in `/scale4` (`model_export.graphs.storage` stores and reads
them; this module packs them and builds the graph nodes). A Gather of the table becomes a Gather of
each part (the ids clamped into it), each part's rows dequantised, and a Where by id; the
unpacking uses integer Div/Mul/Sub only, which every execution provider runs.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

INT4_STORED, INT4_SCALE = "/int4", "/scale4"  # the int4 rows and their fp32 scales
INT4_MAX = 7  # symmetric: -7..7, so that the scale maps a row's largest |value| to exactly 7


def quantize_rows_int4(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric int4: (packed uint8 [n, ceil(d/2)], scale float32 [n, 1]); an all-zero
    row keeps scale 1 and stays exactly zero."""
    rows = np.asarray(rows, dtype=np.float32)
    scale = (np.abs(rows).max(axis=1, keepdims=True) / np.float32(INT4_MAX)).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(rows / scale), -INT4_MAX, INT4_MAX).astype(np.int16) + 8
    if q.shape[1] % 2:
        q = np.hstack([q, np.full((len(q), 1), 8, dtype=q.dtype)])  # a zero to fill the last byte
    return (q[:, 0::2] + 16 * q[:, 1::2]).astype(np.uint8), scale


def dequantize_rows_int4(packed: np.ndarray, scale: np.ndarray, dim: int) -> np.ndarray:
    """The fp32 rows [n, dim] an int4-stored part serves, as the graphs compute them."""
    packed = packed.astype(np.int32)
    q = np.stack([packed % 16, packed // 16], axis=-1).reshape(len(packed), -1)[:, :dim]
    return (q.astype(np.float32) - np.float32(8)) * scale.astype(np.float32)


def _const(name: str, value, dtype):
    tensor = numpy_helper.from_array(np.array(value, dtype=dtype), name)
    return helper.make_node("Constant", [], [name], value=tensor, name=name)


def _unpacked(packed: str, scale: str, dim: int, out: str, p: str) -> list:
    """Nodes: fp32 rows `out` [..., dim] of the int4 rows `packed` [..., ceil(dim/2)] and their
    scales `scale` [..., 1]."""
    width = 2 * ((dim + 1) // 2)
    nodes = [
        helper.make_node("Cast", [packed], [f"{p}/wide"], to=TensorProto.INT32, name=f"{p}/wide"),
        _const(f"{p}/sixteen", 16, np.int32),
        helper.make_node("Div", [f"{p}/wide", f"{p}/sixteen"], [f"{p}/hi"], name=f"{p}/hi"),
        helper.make_node("Mul", [f"{p}/hi", f"{p}/sixteen"], [f"{p}/hi16"], name=f"{p}/hi16"),
        helper.make_node("Sub", [f"{p}/wide", f"{p}/hi16"], [f"{p}/lo"], name=f"{p}/lo"),
        _const(f"{p}/last", [-1], np.int64),
        helper.make_node("Unsqueeze", [f"{p}/lo", f"{p}/last"], [f"{p}/lo1"], name=f"{p}/lo1"),
        helper.make_node("Unsqueeze", [f"{p}/hi", f"{p}/last"], [f"{p}/hi1"], name=f"{p}/hi1"),
        helper.make_node("Concat", [f"{p}/lo1", f"{p}/hi1"], [f"{p}/pairs"], axis=-1, name=f"{p}/pairs"),
        helper.make_node("Shape", [packed], [f"{p}/shape"], end=-1, name=f"{p}/shape"),
        _const(f"{p}/width", [width], np.int64),
        helper.make_node("Concat", [f"{p}/shape", f"{p}/width"], [f"{p}/flat_shape"], axis=0,
                         name=f"{p}/flat_shape"),
        helper.make_node("Reshape", [f"{p}/pairs", f"{p}/flat_shape"], [f"{p}/codes"], name=f"{p}/codes"),
    ]
    codes = f"{p}/codes"
    if width != dim:  # an odd width: the filler column goes
        nodes += [_const(f"{p}/zero", [0], np.int64), _const(f"{p}/dim", [dim], np.int64),
                  helper.make_node("Slice", [codes, f"{p}/zero", f"{p}/dim", f"{p}/last"], [f"{p}/cut"],
                                   name=f"{p}/cut")]
        codes = f"{p}/cut"
    return nodes + [
        helper.make_node("Cast", [codes], [f"{p}/codes_fp32"], to=TensorProto.FLOAT, name=f"{p}/codes_fp32"),
        _const(f"{p}/eight", 8.0, np.float32),
        helper.make_node("Sub", [f"{p}/codes_fp32", f"{p}/eight"], [f"{p}/values"], name=f"{p}/values"),
        helper.make_node("Mul", [f"{p}/values", scale], [out], name=f"{p}/scaled"),
    ]


def _int8_rows(q: str, scale: str, out: str, p: str) -> list:
    return [helper.make_node("Cast", [q], [f"{p}/q8_fp32"], to=TensorProto.FLOAT, name=f"{p}/q8_fp32"),
            helper.make_node("Mul", [f"{p}/q8_fp32", scale], [out], name=f"{p}/scaled8")]


def whole_to_fp32(int8: tuple[str, str], int4: tuple[str, str], dim: int, out: str, p: str) -> list:
    """Nodes computing the whole fp32 table `out` from its int8 part (codes, scales) and its int4
    part (a reader of the whole table: onnxruntime folds them at session load)."""
    return [*_int8_rows(*int8, f"{p}/head", p), *_unpacked(*int4, dim, f"{p}/tail", p),
            helper.make_node("Concat", [f"{p}/head", f"{p}/tail"], [out], axis=0, name=f"{p}/rows")]


def gathered_to_fp32(int8: tuple[str, str], int4: tuple[str, str], first: int, dim: int, gather) -> list:
    """Nodes replacing the Gather `gather` (axis 0) of a table whose rows [0, first) are the int8
    part (codes, scales) and the rest the int4 part: the same fp32 rows."""
    p, ids, out = gather.name, gather.input[1], gather.output[0]
    return [
        helper.make_node("Cast", [ids], [f"{p}/ids"], to=TensorProto.INT64, name=f"{p}/ids"),
        _const(f"{p}/first", first, np.int64),
        _const(f"{p}/last_int8", first - 1, np.int64),
        _const(f"{p}/zero_id", 0, np.int64),
        helper.make_node("Min", [f"{p}/ids", f"{p}/last_int8"], [f"{p}/ids8"], name=f"{p}/ids8"),
        helper.make_node("Sub", [f"{p}/ids", f"{p}/first"], [f"{p}/past"], name=f"{p}/past"),
        helper.make_node("Max", [f"{p}/past", f"{p}/zero_id"], [f"{p}/ids4"], name=f"{p}/ids4"),
        helper.make_node("Gather", [int8[0], f"{p}/ids8"], [f"{p}/q8"], axis=0, name=f"{p}/q8"),
        helper.make_node("Gather", [int8[1], f"{p}/ids8"], [f"{p}/s8"], axis=0, name=f"{p}/s8"),
        *_int8_rows(f"{p}/q8", f"{p}/s8", f"{p}/rows8", p),
        helper.make_node("Gather", [int4[0], f"{p}/ids4"], [f"{p}/q4"], axis=0, name=f"{p}/q4"),
        helper.make_node("Gather", [int4[1], f"{p}/ids4"], [f"{p}/s4"], axis=0, name=f"{p}/s4"),
        *_unpacked(f"{p}/q4", f"{p}/s4", dim, f"{p}/rows4", p),
        helper.make_node("Less", [f"{p}/ids", f"{p}/first"], [f"{p}/in_int8"], name=f"{p}/in_int8"),
        _const(f"{p}/row_axis", [-1], np.int64),
        helper.make_node("Unsqueeze", [f"{p}/in_int8", f"{p}/row_axis"], [f"{p}/pick"], name=f"{p}/pick"),
        helper.make_node("Where", [f"{p}/pick", f"{p}/rows8", f"{p}/rows4"], [out], name=f"{p}/rows"),
    ]
