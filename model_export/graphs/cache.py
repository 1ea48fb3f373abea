"""Reuse of fp32 ONNX exports across bundle exports (`$DISAN_GRAPH_CACHE`, off by default).

Tracing a graph with the dynamo exporter is most of an export's time, and re-exports often
trace the same modules again: the same encoder and NLI model with another sentiment model or
another word-table storage, or the test suite's tiny models in every bundle fixture. With
`DISAN_GRAPH_CACHE=DIR` each traced graph is kept in DIR under a key of everything the trace
reads, and an export that would trace an identical module copies the file instead.

The key covers the module's parameters and buffers, non-persistent ones too (bytes, dtype,
shape), every submodule's class and plain attributes (configs, graph names, the attention chunk
size), the example vocabulary size, the opset, torch's version and the source of the files that
define the graphs.
Anything it cannot read safely (an attribute without a stable repr) makes the key unique, so
the graph is traced: a wrong hit is impossible by construction, a miss only costs the trace.

Word-vector tables are the exception: exports of one model that differ only in how its tables
are stored (`--embedding-storage` rounds them) trace the same graph with other table values. A
traced graph that holds each table verbatim, as the initializer of the table's own name and
shared with nothing else, is kept under a key without the tables' values, and a later export
copies it with the tables' initializers replaced by its own. Every bundle is still verified
against PyTorch after its graphs are written (model_export.export), which is what catches a
graph that derived some other constant from a table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

import disan.model
from disan.embed.shards import atomic_write
from disan.model import BORROWED_KEY

CACHE_ENV = "DISAN_GRAPH_CACHE"
PLAIN = (bool, int, float, str, type(None))
# the files whose code decides a traced graph: the model's math and the export wrappers
SOURCES = (Path(disan.model.__file__), Path(__file__).with_name("wrappers.py"))
# buffers that are word-vector tables (a task model's copy of the encoder's table), beside every
# nn.Embedding's weight
TABLE_BUFFERS = (BORROWED_KEY.rsplit(".", 1)[-1],)


def cache_dir() -> Path | None:
    """The cache folder `$DISAN_GRAPH_CACHE` names, or None (no caching)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value) if value else None


def _attribute(value) -> bytes | None:
    """Stable bytes of a plain attribute, None for what has no stable form."""
    if isinstance(value, PLAIN) or (isinstance(value, tuple) and all(isinstance(v, PLAIN) for v in value)):
        return repr(value).encode()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return repr(dataclasses.asdict(value)).encode()
    if inspect.isfunction(value) or inspect.isbuiltin(value):  # an activation, an identity lambda
        parts = [f"{value.__module__}.{value.__qualname__}".encode()]
        for cell in getattr(value, "__closure__", None) or ():  # what a closure captured is data
            try:
                captured = _attribute(cell.cell_contents)
            except ValueError:  # an empty cell
                return None
            if captured is None:
                return None
            parts.append(captured)
        return b"|".join(parts)
    return None


def table_names(module: nn.Module) -> set[str]:
    """Qualified names of `module`'s word-vector tables: every nn.Embedding's weight and every
    TABLE_BUFFERS buffer (a table reachable under two names has both)."""
    names = set()
    for name, sub in module.named_modules(remove_duplicate=False):
        prefix = f"{name}." if name else ""
        if isinstance(sub, nn.Embedding):
            names.add(f"{prefix}weight")
        names.update(f"{prefix}{leaf}" for leaf in TABLE_BUFFERS if sub._buffers.get(leaf) is not None)
    return names


def _tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer under each of its names, a non-persistent buffer too."""
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def graph_key(module: nn.Module, vocab_size: int, opset: int,
              without: frozenset[str] | set[str] = frozenset()) -> str | None:
    """Hex key of everything that decides `module`'s traced graph, the values of the tensors named
    in `without` left out (their names, dtypes and shapes still in); None when some attribute has
    no stable form (then the graph is not cached)."""
    h = hashlib.sha256()
    if without:  # a key of its own kind: a graph whose tables are to be replaced
        h.update(b"tables replaced:" + ",".join(sorted(without)).encode() + b"\0")
    for part in (torch.__version__, str(opset), str(vocab_size)):
        h.update(part.encode() + b"\0")
    for source in SOURCES:
        h.update(source.read_bytes())
    for name, sub in module.named_modules():
        h.update(f"{name}:{type(sub).__module__}.{type(sub).__qualname__}\0".encode())
        for key, value in sorted(vars(sub).items()):
            if key.startswith("_") or key == "training":
                continue
            stable = _attribute(value)
            if stable is None:
                return None
            h.update(key.encode() + b"=" + stable + b"\0")
    # parameters and every buffer, a non-persistent one (not in state_dict) too
    for key, tensor in _tensors(module):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}\0".encode())
        if key not in without:
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _values(module: nn.Module, names: set[str]) -> dict[str, np.ndarray]:
    return {k: t.detach().cpu().numpy() for k, t in _tensors(module) if k in names}


def holds_tables_verbatim(path: Path, module: nn.Module, tables: set[str]) -> bool:
    """Whether the graph at `path` holds each of `module`'s `tables` as the fp32 initializer of
    its own name, equal to it, and shares no table's values with any other tensor of the module
    (the exporter merges equal initializers): then replacing those initializers gives the graph of
    the module with other tables."""
    if not tables:
        return False
    stored = {i.name: i for i in onnx.load(str(path)).graph.initializer}
    values = _values(module, tables)
    for name in tables:
        if name not in stored or stored[name].data_type != onnx.TensorProto.FLOAT:
            return False
        if not np.array_equal(numpy_helper.to_array(stored[name]), values[name]):
            return False
    others = [t.detach().cpu().numpy() for k, t in _tensors(module) if k not in tables]
    return not any(o.shape == v.shape and np.array_equal(o, v) for v in values.values() for o in others)


def write_with_tables(source: Path, path: Path, module: nn.Module, tables: set[str]) -> None:
    """Write the graph at `source` to `path` with `module`'s `tables` over the initializers of
    their names."""
    model = onnx.load(str(source))
    values = _values(module, tables)
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name].astype(np.float32), init.name))
    onnx.save(model, str(path))


def cached_export(module: nn.Module, path: Path, vocab_size: int, opset: int,
                  export: Callable[[], Path]) -> Path:
    """`export()` (which writes `path`), or a copy of the same graph traced before (with this
    module's tables written in, when it was kept under the key without them)."""
    folder = cache_dir()
    key = graph_key(module, vocab_size, opset) if folder is not None else None
    if key is None:
        return export()
    tables = table_names(module)
    loose = graph_key(module, vocab_size, opset, without=tables) if tables else None
    for kept, swap in ((key, False), (loose, True)):
        hit = folder / f"{kept}.onnx"
        if kept is not None and hit.is_file():
            if swap:
                write_with_tables(hit, path, module, tables)
            else:
                shutil.copyfile(hit, path)
            return path
    export()
    kept = loose if loose is not None and holds_tables_verbatim(path, module, tables) else key
    folder.mkdir(parents=True, exist_ok=True)
    with path.open("rb") as traced:  # a reader of the cache sees no half-written file
        atomic_write(folder / f"{kept}.onnx", lambda out: shutil.copyfileobj(traced, out))
    return path
