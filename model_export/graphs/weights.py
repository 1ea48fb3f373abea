"""Weights inside the exported graphs: named after their parameters, stored once.

Every graph of a bundle is saved with its large initializers as ONNX external data in ONE shared
file (`weights.data`), deduplicated by content: the CPU and GPU graph sets, the explain graphs and
the fp16 variant (fp32 weights cast once at session load, see `share_fp32_weights`) all read
the same bytes, so each encoder's weights are on disk once. How a tensor is stored in that file
(fp16, per-row int8) and read back is `model_export.graphs.storage`'s.

Initializers are renamed after the parameter they hold, ``<task>/<state-dict key>`` (``/T`` when
the exporter stored the matrix transposed), so a bundle is self-describing: the PyTorch models
can be rebuilt from its graphs (`model_export.graphs.storage.state_dicts_from_graphs`) to check the
graphs against `disan.model` on a machine without the checkpoints, and old bundles can be
converted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from disan.bundle.manifest import WEIGHTS_FILE

EXTERNAL_MIN_BYTES = 1024  # smaller tensors (scalars, shape constants) stay inside their graph
ALIGN = 4096               # page-aligned offsets: onnxruntime can memory-map the tensors
TRANSPOSED = "/T"
FP16_SUFFIX = "/fp16"


def subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every graph nested in its nodes' attributes (Scan/Loop/If bodies)."""
    yield graph
    yield from nested_graphs(graph.node)


def nested_graphs(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.GraphProto]:
    """Every graph held in `nodes`' attributes, and the graphs nested in those."""
    for node in nodes:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from subgraphs(sub)


def all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of `model`: its graph's, its subgraphs' (Scan bodies) and its functions'."""
    functions = [f.node for f in model.functions]
    graphs = [*subgraphs(model.graph), *(g for nodes in functions for g in nested_graphs(nodes))]
    return [n for g in graphs for n in g.node] + [n for nodes in functions for n in nodes]


def rename_values(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename values (initializers, node inputs/outputs, value_info) here and in every subgraph,
    which read outer-scope values by name."""
    for g in subgraphs(graph):
        for init in g.initializer:
            init.name = names.get(init.name, init.name)
        for info in [*g.input, *g.output, *g.value_info]:
            info.name = names.get(info.name, info.name)
        for node in g.node:
            node.input[:] = [names.get(x, x) for x in node.input]
            node.output[:] = [names.get(x, x) for x in node.output]


def _digest(arr: np.ndarray) -> tuple[str, tuple[int, ...], str]:
    arr = np.ascontiguousarray(arr)
    return str(arr.dtype), arr.shape, hashlib.sha256(arr.tobytes()).hexdigest()


def name_by_parameters(model: onnx.ModelProto, task: str, params: dict[str, np.ndarray],
                       prefixes: Iterable[str] = ("model.",)) -> dict[str, str]:
    """Rename `model`'s float initializers after the parameters (of `task`'s model) they equal.

    An initializer whose own name is a parameter's key (after a wrapper prefix) with equal value
    keeps that key; others (the exporter's `val_N`, often a transposed copy) are matched by
    value, a transposed match marked `/T`. The exporter merges equal constants (e.g. two
    all-zero biases) into one initializer: the parameters left without one of their own are
    returned as aliases {"<task>/<missing key>": "<task>/<key of the equal initializer>"}.
    """
    by_value: dict[tuple, list[str]] = {}
    for key, value in params.items():
        if value.dtype != np.float32 or value.size < 2:
            continue
        by_value.setdefault(_digest(value), []).append(key)
        if value.ndim == 2:
            by_value.setdefault(_digest(value.T), []).append(key + TRANSPOSED)
    taken: set[str] = set()
    renames: dict[str, str] = {}
    matched: list[tuple[str, list[str]]] = []
    for init in model.graph.initializer:
        if init.data_type != TensorProto.FLOAT:
            continue
        candidates = by_value.get(_digest(numpy_helper.to_array(init)), [])
        own = next((init.name.removeprefix(p) for p in prefixes if init.name.startswith(p)), init.name)
        # equal parameters (e.g. two zero biases) are told apart by the exporter's own name
        pick = own if own in candidates else next((c for c in candidates if c not in taken), None)
        if pick is not None:
            taken.add(pick)
            renames[init.name] = f"{task}/{pick}"
            matched.append((pick, candidates))
    rename_values(model.graph, renames)
    aliases = {}
    have = {t.removesuffix(TRANSPOSED) for t in taken}
    for pick, candidates in matched:
        for other in candidates:
            if other.removesuffix(TRANSPOSED) not in have:
                aliases[f"{task}/{other}"] = f"{task}/{pick}"
    return aliases


def share_fp32_weights(fp16: onnx.ModelProto, fp32: onnx.ModelProto) -> int:
    """Let an fp16 graph read the fp32 graph's weights: each large fp16 initializer becomes its
    fp32 twin (same name, same bytes as the fp32 graph's, so stored once) plus a Cast to fp16.

    onnxruntime folds these constant Casts when it optimises the session, so the running graph
    is the plain fp16 one (with graph optimisation disabled they would run on every call).
    Returns how many initializers were shared.
    """
    originals = {init.name: init for init in fp32.graph.initializer}
    graph = fp16.graph
    kept, casts, renames = [], [], {}
    for init in graph.initializer:
        twin = originals.get(init.name)
        if (init.data_type == TensorProto.FLOAT16 and twin is not None
                and twin.data_type == TensorProto.FLOAT and tensor_nbytes(twin) >= EXTERNAL_MIN_BYTES):
            half = init.name + FP16_SUFFIX
            renames[init.name] = half
            source = TensorProto()
            source.CopyFrom(twin)
            kept.append(source)
            casts.append(helper.make_node("Cast", [init.name], [half], to=TensorProto.FLOAT16,
                                          name=f"cast{len(casts)}"))
        else:
            kept.append(init)
    # rename the consumers first (the fp32 sources keep the plain name), then swap initializers
    del graph.initializer[:]
    rename_values(graph, renames)
    graph.initializer.extend(kept)
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(casts)


def tensor_nbytes(init: TensorProto) -> int:
    return int(numpy_helper.to_array(init).nbytes)


class SharedWeights:
    """Writes the large initializers of many graphs into one file, each distinct tensor once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._offsets: dict[tuple, tuple[int, int]] = {}
        self.tensors = 0

    def externalize(self, model: onnx.ModelProto) -> None:
        """Point `model`'s large initializers at the shared file, writing the ones not yet in it.

        Main-graph initializers only: the weights live there (a Scan body holds small constants).
        """
        for init in model.graph.initializer:
            arr = numpy_helper.to_array(init)
            if arr.nbytes < EXTERNAL_MIN_BYTES:
                continue
            key = _digest(arr)
            if key not in self._offsets:
                offset = -(-self._fh.tell() // ALIGN) * ALIGN
                self._fh.write(b"\0" * (offset - self._fh.tell()))
                self._fh.write(np.ascontiguousarray(arr).tobytes())
                self._offsets[key] = (offset, arr.nbytes)
                self.tensors += 1
            offset, length = self._offsets[key]
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
            set_external_data(init, WEIGHTS_FILE, offset, length)
            init.ClearField("raw_data")

    def close(self) -> None:
        self._fh.close()
