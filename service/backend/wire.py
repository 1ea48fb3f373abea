"""The frames between HTTP workers and the shared inference process (service.backend.remote <->
service.backend.inference_process): length-prefixed binary, numpy buffers in and out, no pickle.

A frame is a little-endian u32 byte count and that many bytes. A request carries its id, an
operation and a graph name; a reply carries the id it answers, a status and a body:

    request  = u32 id, u8 op, u8 len, graph name, payloads        (op RUN; HELLO, STATS and CANCEL
                                                                   of a RUN's id: no payloads)
    reply    = u32 id, u8 status, body
               OK    -> f32 queue_s, f32 inference_s, f32 queued_s (the shared queue) and
                        f32 item_s (seconds per queued sentence), for admission; results  (RUN)
               OK    -> JSON                                       (HELLO, STATS)
               ERROR -> u8 kind, u16 retry_after, UTF-8 message

Payloads are what the engine hands a batcher: token-id rows (every sentence graph) or, for
`nli_head`, (u, v) pairs of vectors or of matrices (an explained pair's rows). Results are what a
batcher returns: one array per item (stacked into one array when all have the same shape, the
common case) or, for the explain graphs, one dict of arrays per item. Arrays travel as a small
header (dtype, shape) plus their raw bytes and come back as `np.frombuffer` views: no copy and
no per-number work on either side, which is what keeps the hop cheap next to an onnxruntime call.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

# CANCEL names the id of a RUN whose caller left (client gone): no reply; its items are withdrawn.
RUN, HELLO, STATS, CANCEL = 1, 2, 3, 4
OK, ERROR = 0, 1
# Error kinds: how the worker answers its client (service.common.errors): 500, 429 or 503.
FAILED, OVERLOADED, NOT_READY = 0, 1, 2
MAX_FRAME = 1 << 30  # a sanity bound: a corrupt length must not allocate gigabytes

_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.int64),
           np.dtype(np.float64)]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_U32 = struct.Struct("<I")
_REQUEST = struct.Struct("<IBB")
_REPLY = struct.Struct("<IB")
_TIMES = struct.Struct("<ffff")
_ERROR = struct.Struct("<BH")


class WireError(Exception):
    """A frame that does not parse (never expected between our own two ends)."""


# ---------------------------------------------------------------- arrays
def pack_arrays(arrays: Sequence[np.ndarray]) -> bytes:
    """u16 count, per array (u8 dtype, u8 ndim, u32 x ndim shape), then every array's bytes."""
    head = [struct.pack("<H", len(arrays))]
    body = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        head.append(struct.pack(f"<BB{a.ndim}I", _CODE[a.dtype], a.ndim, *a.shape))
        body.append(a.tobytes())
    return b"".join(head + body)


def unpack_arrays(buf: memoryview, at: int = 0) -> tuple[list[np.ndarray], int]:
    """The arrays `pack_arrays` wrote at `at` (views into `buf`), and the offset after them."""
    (count,) = struct.unpack_from("<H", buf, at)
    at += 2
    specs = []
    for _ in range(count):
        code, ndim = struct.unpack_from("<BB", buf, at)
        shape = struct.unpack_from(f"<{ndim}I", buf, at + 2)
        at += 2 + 4 * ndim
        specs.append((_DTYPES[code], shape))
    out = []
    for dtype, shape in specs:
        n = int(np.prod(shape, dtype=np.int64))
        out.append(np.frombuffer(buf, dtype, n, at).reshape(shape))
        at += n * dtype.itemsize
    return out, at


# ---------------------------------------------------------------- payloads
def pack_payloads(graph: str, payloads: Sequence[Any]) -> bytes:
    """Token-id rows as (lengths, flat ids) int32; nli_head pairs as two stacked arrays (vector
    pairs) or the pairs' arrays in turn (matrix pairs)."""
    if graph != "nli_head":
        lengths = np.fromiter(map(len, payloads), np.int32, len(payloads))
        flat = np.fromiter((i for row in payloads for i in row), np.int32, int(lengths.sum()))
        return b"R" + pack_arrays([lengths, flat])
    if all(np.ndim(u) == 1 for u, _ in payloads):
        return b"V" + pack_arrays([np.stack([u for u, _ in payloads]), np.stack([v for _, v in payloads])])
    return b"M" + pack_arrays([a for pair in payloads for a in pair])


def unpack_payloads(buf: memoryview, at: int) -> list[Any]:
    kind = bytes(buf[at:at + 1])
    arrays, _ = unpack_arrays(buf, at + 1)
    if kind == b"R":
        lengths, flat = arrays
        ids = flat.tolist()
        out, start = [], 0
        for n in lengths.tolist():
            out.append(ids[start:start + n])
            start += n
        return out
    if kind == b"V":
        return list(zip(arrays[0], arrays[1], strict=True))
    if kind == b"M":
        return list(zip(arrays[0::2], arrays[1::2], strict=True))
    raise WireError(f"unknown payload kind {kind!r}")


# ---------------------------------------------------------------- results
def pack_results(results: Sequence[Any]) -> bytes:
    """One stacked array (every result an array of one shape), the arrays in turn, or per item
    a dict of arrays with the same keys (the explain graphs)."""
    first = results[0]
    if isinstance(first, dict):
        keys = list(first)
        head = json.dumps(keys).encode()
        return (b"D" + _U32.pack(len(head)) + head
                + pack_arrays([np.asarray(r[k]) for r in results for k in keys]))
    arrays = [np.asarray(r) for r in results]
    if len({(a.shape, a.dtype) for a in arrays}) == 1:
        return b"S" + pack_arrays([np.stack(arrays)])
    return b"A" + pack_arrays(arrays)


def unpack_results(buf: memoryview, at: int) -> list[Any]:
    kind = bytes(buf[at:at + 1])
    at += 1
    if kind == b"D":
        (n,) = _U32.unpack_from(buf, at)
        keys = json.loads(bytes(buf[at + 4:at + 4 + n]))
        arrays, _ = unpack_arrays(buf, at + 4 + n)
        k = len(keys)
        return [dict(zip(keys, arrays[i:i + k], strict=True)) for i in range(0, len(arrays), k)]
    arrays, _ = unpack_arrays(buf, at)
    if kind == b"S":
        return list(arrays[0])
    if kind == b"A":
        return arrays
    raise WireError(f"unknown result kind {kind!r}")


# ---------------------------------------------------------------- frames
def request(request_id: int, op: int, graph: str = "", payloads: Sequence[Any] = ()) -> bytes:
    name = graph.encode()
    body = _REQUEST.pack(request_id, op, len(name)) + name
    if op == RUN:
        body += pack_payloads(graph, payloads)
    return _U32.pack(len(body)) + body


def request_head(buf: memoryview) -> tuple[int, int]:
    """(id, op) of one request body, without parsing its payloads."""
    request_id, op, _ = _REQUEST.unpack_from(buf, 0)
    return request_id, op


def parse_request(buf: memoryview) -> tuple[int, int, str, list[Any]]:
    """(id, op, graph, payloads) of one request body."""
    request_id, op, n = _REQUEST.unpack_from(buf, 0)
    graph = bytes(buf[_REQUEST.size:_REQUEST.size + n]).decode()
    payloads = unpack_payloads(buf, _REQUEST.size + n) if op == RUN else []
    return request_id, op, graph, payloads


def reply_ok(request_id: int, results: Sequence[Any], times: tuple[float, float, float, float]) -> bytes:
    body = _REPLY.pack(request_id, OK) + _TIMES.pack(*times) + pack_results(results)
    return _U32.pack(len(body)) + body


def reply_json(request_id: int, value: Any) -> bytes:
    body = _REPLY.pack(request_id, OK) + json.dumps(value).encode()
    return _U32.pack(len(body)) + body


def reply_error(request_id: int, kind: int, message: str, retry_after: int = 1) -> bytes:
    body = _REPLY.pack(request_id, ERROR) + _ERROR.pack(kind, min(retry_after, 65535)) + message.encode()
    return _U32.pack(len(body)) + body


def parse_reply_head(buf: memoryview) -> tuple[int, int]:
    """(id, status) of one reply body."""
    return _REPLY.unpack_from(buf, 0)


def parse_run_reply(buf: memoryview) -> tuple[list[Any], tuple[float, float, float, float]]:
    """Results and (queue_s, inference_s, queued_s, item_s) of an OK reply to RUN."""
    times = _TIMES.unpack_from(buf, _REPLY.size)
    return unpack_results(buf, _REPLY.size + _TIMES.size), times


def parse_json_reply(buf: memoryview) -> Any:
    return json.loads(bytes(buf[_REPLY.size:]))


def parse_error(buf: memoryview) -> tuple[int, int, str]:
    """(kind, retry_after, message) of an ERROR reply."""
    kind, retry = _ERROR.unpack_from(buf, _REPLY.size)
    return kind, retry, bytes(buf[_REPLY.size + _ERROR.size:]).decode(errors="replace")


async def read_frame(reader: asyncio.StreamReader) -> memoryview:
    """One frame's body; IncompleteReadError at a clean end of stream."""
    (n,) = _U32.unpack(await reader.readexactly(4))
    if n > MAX_FRAME:
        raise WireError(f"frame of {n} bytes")
    return memoryview(await reader.readexactly(n))
