"""Thin export wrappers around the models in `disan/model.py`, and the ONNX writers.

The wrappers only pick outputs, apply the final softmax and cast to float32; every piece of
model math stays in `disan/model.py`. Graph input/output names follow `disan/manifest.py`.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from disan.model import DiSANEncoder, NLIModel, SentimentModel

OPSET = 18  # >= 17 (LayerNorm etc.); 18 is what the dynamo exporter emits natively
# Example sizes for tracing: batch >= 2 and length >= 3 so torch.export never specialises an
# axis to 0/1 (sizes 0 and 1 are special-cased by the symbolic shape engine).
EXAMPLE_BATCH, EXAMPLE_LEN = 3, 5


class EncoderGraph(nn.Module):
    """ids [B,n], mask [B,n] -> embedding [B,D] (float32)."""

    input_names = ("ids", "mask")
    output_names = ("embedding",)

    def __init__(self, encoder: DiSANEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.encoder(ids, mask).float()


class NLIGraph(nn.Module):
    """premise/hypothesis ids+mask -> class probabilities [B,K] (float32)."""

    input_names = ("premise_ids", "premise_mask", "hypothesis_ids", "hypothesis_mask")
    output_names = ("probs",)

    def __init__(self, model: NLIModel):
        super().__init__()
        self.model = model

    def forward(self, p_ids: Tensor, p_mask: Tensor, h_ids: Tensor, h_mask: Tensor) -> Tensor:
        # softmax in float32 so the fp16 variant still returns well-normalised probabilities
        return torch.softmax(self.model(p_ids, p_mask, h_ids, h_mask).float(), dim=-1)


class SentimentGraph(nn.Module):
    """ids, mask -> class probabilities [B,K] (float32)."""

    input_names = ("ids", "mask")
    output_names = ("probs",)

    def __init__(self, model: SentimentModel):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return torch.softmax(self.model(ids, mask).float(), dim=-1)


class SentimentExplainGraph(nn.Module):
    """ids, mask -> probs [B,K], attn_fw, attn_bw [B,n,n], gate_fw, gate_bw, s2t [B,n].

    Attention maps are already averaged over features by the encoder; the fusion gates are
    averaged over features here (a display summary, not model math).
    """

    input_names = ("ids", "mask")
    output_names = ("probs", "attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t")

    def __init__(self, model: SentimentModel):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, mask: Tensor):
        sent, ex = self.model.encoder(ids, mask, return_tokens=True)
        logits = self.model.out(self.model.hidden(sent))
        return (torch.softmax(logits.float(), dim=-1), ex["attn_fw"].float(), ex["attn_bw"].float(),
                ex["gate_fw"].mean(dim=-1).float(), ex["gate_bw"].mean(dim=-1).float(),
                ex["s2t"].float())


def example_inputs(num_inputs: int, vocab_size: int) -> tuple[Tensor, ...]:
    """(ids, mask) pairs with mixed padding; pair k gets length EXAMPLE_LEN + k (distinct axes)."""
    gen = torch.Generator().manual_seed(0)
    out: list[Tensor] = []
    for k in range(num_inputs // 2):
        n = EXAMPLE_LEN + k
        ids = torch.randint(2, vocab_size, (EXAMPLE_BATCH, n), generator=gen)
        lengths = torch.tensor([n, n - 2, n - 1])
        mask = torch.arange(n)[None, :] < lengths[:, None]
        out += [ids * mask, mask]
    return tuple(out)


def export_graph(module: nn.Module, path: Path, vocab_size: int, opset: int = OPSET) -> Path:
    """Export `module` (an *Graph wrapper) to a single-file ONNX model with dynamic B and n axes."""
    module = module.eval()
    names: Sequence[str] = module.input_names
    args = example_inputs(len(names), vocab_size)
    batch = torch.export.Dim("batch")
    dyn = []
    for k in range(len(names) // 2):
        # premise and hypothesis have independent lengths; ids and mask of one text share theirs
        seq = torch.export.Dim(f"seq{k}" if len(names) > 2 else "seq")
        dyn += [{0: batch, 1: seq}, {0: batch, 1: seq}]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # exporter chatter (deprecations, axis-name notes)
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(
            module, args, None, dynamo=True, opset_version=opset, input_names=list(names),
            dynamic_shapes=tuple(dyn), external_data=False, verbose=False,
        )
    _rename_outputs(program.model.graph, module.output_names)
    # external_data=False: one self-contained file (the graphs are far below the 2 GB limit)
    program.save(str(path), external_data=False)
    return path


def _rename_outputs(graph, output_names: Sequence[str]) -> None:
    """Give the graph outputs their contract names.

    Done here rather than via `output_names=` because the exporter names internal values after
    their aten op, and e.g. the embedding lookup's value is already called "embedding".
    """
    import onnx_ir as ir

    wanted = set(output_names)
    outputs = list(graph.outputs)
    if len(outputs) != len(output_names):
        raise RuntimeError(f"graph has {len(outputs)} outputs, expected {list(output_names)}")
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for value in node.outputs:
            if value.name in wanted and value not in outputs:
                value.name = f"{value.name}_internal"
    for value, name in zip(outputs, output_names, strict=True):
        value.name = name


def extract(src: Path, dst: Path, inputs: Sequence[str], outputs: Sequence[str],
            rename: dict[str, str] | None = None) -> Path:
    """Cut the subgraph computing `outputs` from `inputs` out of `src`, renaming I/O if asked.

    Only nodes the outputs depend on are kept (onnx.utils.Extractor), so the extracted graph
    is exactly the computation of those outputs, with the same weights and dynamic axes.
    """
    import onnx
    from onnx.utils import Extractor

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
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "values truncated to fp16 range" chatter for tiny weights
        model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))
    return dst


def check_onnx(path: Path) -> None:
    """Run the full onnx checker (with shape inference); raises onnx.checker.ValidationError."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)


def quantize_int8(src: Path, dst: Path, quantize_embedding: bool = True) -> Path:
    """Dynamic int8 quantisation of MatMul weights (and the embedding Gather if asked)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ops = ["MatMul", "Gemm"] + (["Gather"] if quantize_embedding else [])
    model = onnx.load(str(src))
    # The exporter's value_info annotates Gemm weights in their transB layout; ORT's quantizer
    # re-runs shape inference and trips over them ("(64) vs (16)"), so let it infer afresh.
    del model.graph.value_info[:]
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.onnx"
        onnx.save(model, str(plain))
        quantize_dynamic(str(plain), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=ops)
    return dst


def build_wrappers(nli_model: NLIModel, sentiment_model: SentimentModel) -> dict[str, nn.Module]:
    """Graph name -> wrapper module, in eval mode (no explain graph for the mask_kind='none' ablation)."""
    wrappers: dict[str, nn.Module] = {
        "encoder": EncoderGraph(nli_model.encoder),
        "nli": NLIGraph(nli_model),
        "sentiment": SentimentGraph(sentiment_model),
    }
    if sentiment_model.cfg.mask_kind != "none":
        wrappers["sentiment_explain"] = SentimentExplainGraph(sentiment_model)
    return {name: w.eval() for name, w in wrappers.items()}


def export_fp32_graphs(nli_model: NLIModel, sentiment_model: SentimentModel, out: Path,
                       files: dict[str, str]) -> dict[str, Path]:
    """Write the fp32 graphs into `out` (names from `files`): three exports plus one extraction.

    sentiment.onnx is cut out of the explain graph (same inputs, a subset of the outputs). The
    encoder is NOT cut out of the NLI graph: there the exporter reads the shared batch size
    from the hypothesis inputs, so the premise branch is not self-contained.
    """
    vocab_size = nli_model.cfg.vocab_size
    paths = {
        "encoder": export_graph(EncoderGraph(nli_model.encoder), out / files["encoder"], vocab_size),
        "nli": export_graph(NLIGraph(nli_model), out / files["nli"], vocab_size),
    }
    if sentiment_model.cfg.mask_kind == "none":  # no attention maps to explain: plain graph only
        paths["sentiment"] = export_graph(SentimentGraph(sentiment_model), out / files["sentiment"],
                                          vocab_size)
    else:
        explain = export_graph(SentimentExplainGraph(sentiment_model), out / files["sentiment_explain"],
                               vocab_size)
        paths["sentiment"] = extract(explain, out / files["sentiment"], SentimentGraph.input_names,
                                     SentimentGraph.output_names)
        paths["sentiment_explain"] = explain
    return paths
