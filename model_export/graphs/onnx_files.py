"""Transforms of exported ONNX files: subgraph extraction, fp16 and int8 variants, checking.

Model math never lives here: these functions rewrite graphs that `model_export.graphs.wrappers` exported
from `disan/model.py`, and every variant is checked with the full onnx checker.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx.utils import Extractor
from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic
from onnxruntime.transformers.float16 import convert_float_to_float16

from model_export.graphs.weights import all_nodes


def extract(src: Path, dst: Path, inputs: Sequence[str], outputs: Sequence[str],
            rename: dict[str, str] | None = None) -> Path:
    """Cut the subgraph computing `outputs` from `inputs` out of `src`, renaming I/O if asked.

    Only nodes the outputs depend on are kept (onnx.utils.Extractor), so the extracted graph
    is exactly the computation of those outputs, with the same weights and dynamic axes.
    """
    model = Extractor(onnx.load(str(src))).extract_model(list(inputs), list(outputs))
    for old, new in (rename or {}).items():
        for value in [*model.graph.input, *model.graph.output]:
            if value.name == old:
                value.name = new
        for node in model.graph.node:
            node.input[:] = [new if x == old else x for x in node.input]
            node.output[:] = [new if x == old else x for x in node.output]
    onnx.save(model, str(dst))
    return dst


def convert_fp16(src: Path, dst: Path) -> Path:
    """Half-precision copy of a verified fp32 graph: fp16 weights and activations, same I/O types.

    Uses onnxruntime's float16 converter with keep_io_types (ids/mask in, float32 out). The model
    math needs no change: disan/model.py never uses -inf or literals outside the fp16 range.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "values truncated to fp16 range" chatter for tiny weights
        model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    sort_nodes(model.graph)  # the converter appends the casts of float inputs after their users
    onnx.save(model, str(dst))
    return dst


def strip_node_metadata(model) -> None:
    """Drop the metadata the exporter puts on every node (subgraphs and functions too): the
    Python stack that made it, with this checkout's file paths, and fx names holding memory
    addresses. Shipped graphs name no machine, and the same checkpoints export to the same bytes.
    The graphs' computation is untouched; a debugger wanting the stacks can export again."""
    for node in all_nodes(model):
        del node.metadata_props[:]


def check_onnx(path: Path) -> None:
    """Run the full onnx checker (with shape inference); raises onnx.checker.ValidationError."""
    onnx.checker.check_model(str(path), full_check=True)


def quantize_int8(src: Path, dst: Path, quantize_embedding: bool = True) -> Path:
    """Dynamic int8 quantisation of MatMul weights (and the embedding Gather if asked)."""
    ops = ["MatMul", "Gemm"] + (["Gather"] if quantize_embedding else [])
    model = onnx.load(str(src))
    # The exporter's value_info annotates Gemm weights in their transB layout; ORT's quantizer
    # re-runs shape inference and trips over them ("(64) vs (16)"), so let it infer afresh.
    del model.graph.value_info[:]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs advice on the root logger
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plain, pre = Path(tmp) / "plain.onnx", Path(tmp) / "pre.onnx"
            onnx.save(model, str(plain))
            # Constant-fold first: where a weight feeds two MatMuls (premise and hypothesis in
            # nli.onnx) the exporter keeps a Transpose node, and the quantizer skips MatMuls whose
            # weight is not an initializer (nli.int8 was 9.7 MB instead of 5.0 MB at 55k words).
            quant_pre_process(str(plain), str(pre), skip_symbolic_shape=True)
            quantize_dynamic(str(pre), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=ops)
    finally:
        root.setLevel(level)
    quantized = onnx.load(str(dst))
    sort_nodes(quantized.graph)
    onnx.save(quantized, str(dst))
    return dst


def _outer_inputs(graph) -> set[str]:
    """Names a (sub)graph's nodes read from an enclosing scope (not produced or declared in it)."""
    local = {v.name for v in [*graph.input, *graph.initializer]} | {o for n in graph.node for o in n.output}
    needed = {i for n in graph.node for i in n.input if i}
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                needed |= _outer_inputs(sub)
    return needed - local


def sort_nodes(graph) -> None:
    """Topologically re-sort `graph`'s nodes, counting what their subgraphs (Scan bodies) read
    from this scope: ORT's quantizer sorts by explicit inputs only and can put the Scan of the
    chunked attention before the Concat its body reads, which the onnx checker rejects."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    deps = []
    for node in graph.node:
        names = set(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                names |= _outer_inputs(sub)
        deps.append({producer[x] for x in names if x in producer})
    order, placed = [], set()
    while len(order) < len(graph.node):  # stable: earliest ready node first
        ready = next(i for i in range(len(graph.node)) if i not in placed and deps[i] <= placed)
        order.append(ready)
        placed.add(ready)
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)
