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
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import disan.model
from disan.shards import atomic_write

CACHE_ENV = "DISAN_GRAPH_CACHE"
PLAIN = (bool, int, float, str, type(None))
# the files whose code decides a traced graph: the model's math and the export wrappers
SOURCES = (Path(disan.model.__file__), Path(__file__).with_name("graphs.py"))


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


def graph_key(module: nn.Module, vocab_size: int, opset: int) -> str | None:
    """Hex key of everything that decides `module`'s traced graph; None when some attribute has
    no stable form (then the graph is not cached)."""
    h = hashlib.sha256()
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
    for key, tensor in [*module.named_parameters(remove_duplicate=False),
                        *module.named_buffers(remove_duplicate=False)]:
        t = tensor.detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cached_export(module: nn.Module, path: Path, vocab_size: int, opset: int,
                  export: Callable[[], Path]) -> Path:
    """`export()` (which writes `path`), or a copy of the same graph traced before."""
    folder = cache_dir()
    key = graph_key(module, vocab_size, opset) if folder is not None else None
    if key is None:
        return export()
    hit = folder / f"{key}.onnx"
    if hit.is_file():
        shutil.copyfile(hit, path)
        return path
    export()
    folder.mkdir(parents=True, exist_ok=True)
    with path.open("rb") as traced:  # a reader of the cache sees no half-written file
        atomic_write(hit, lambda out: shutil.copyfileobj(traced, out))
    return path
