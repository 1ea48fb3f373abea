"""Thin export wrappers around the models in `disan/model.py`, and the fp32 ONNX export.

The wrappers only pick outputs, apply the final softmax and cast to float32; every piece of
model math stays in `disan/model.py`. Graph input/output names follow `disan/manifest.py`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from disan.manifest import GRAPHS
from disan.model import DiSANEncoder, NLIModel, SentimentModel
from model_export.onnx_files import extract

OPSET = 18  # >= 17 (LayerNorm etc.); 18 is what the dynamo exporter emits natively
# Where the explain outputs live: their own graph (sentiment_explain.onnx, default); in
# sentiment.onnx itself (saves one embedding table, ~2 MB per 10k words; the service then
# computes the maps on every sentiment call, a few % more work); or nowhere.
EXPLAIN_MODES = ("separate", "merged", "none")
# Example sizes for tracing: batch >= 2 and length >= 3 so torch.export never specialises an
# axis to 0/1 (sizes 0 and 1 are special-cased by the symbolic shape engine).
EXAMPLE_BATCH, EXAMPLE_LEN = 3, 5
# The exported graphs compute the packed token2token attention in query-row chunks of about
# this many (batch x rows x tokens) pairs, an ONNX Scan (disan.model._pair_rows_in_chunks).
# 1024 was the fastest chunk with 1 ORT thread per call (the CPU compose setting); with more
# intra-op threads chunking does not help (bench/packing.py; numbers in bench/RESULTS.md).
ATTENTION_CHUNK_CELLS = 1024


class EncoderGraph(nn.Module):
    """ids [B,n], mask [B,n] -> embedding [B,D] (float32)."""

    input_names = GRAPHS["encoder"].inputs
    output_names = GRAPHS["encoder"].outputs

    def __init__(self, encoder: DiSANEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.encoder(ids, mask).float()


class NLIGraph(nn.Module):
    """premise/hypothesis ids+mask -> class probabilities [B,K] (float32)."""

    input_names = GRAPHS["nli"].inputs
    output_names = GRAPHS["nli"].outputs

    def __init__(self, model: NLIModel):
        super().__init__()
        self.model = model

    def forward(self, p_ids: Tensor, p_mask: Tensor, h_ids: Tensor, h_mask: Tensor) -> Tensor:
        # softmax in float32 so the fp16 variant still returns well-normalised probabilities
        return torch.softmax(self.model(p_ids, p_mask, h_ids, h_mask).float(), dim=-1)


class SentimentGraph(nn.Module):
    """ids, mask -> class probabilities [B,K] (float32)."""

    input_names = GRAPHS["sentiment"].inputs
    output_names = GRAPHS["sentiment"].outputs

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

    input_names = GRAPHS["sentiment_explain"].inputs
    output_names = GRAPHS["sentiment_explain"].outputs

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
    import onnx_ir as ir  # comes with onnxscript; only the renaming pass needs it

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


def explain_mode(sentiment_model: SentimentModel, wanted: str) -> str:
    """The explain layout actually possible: 'none' for the mask_kind='none' ablation (no attention)."""
    if wanted not in EXPLAIN_MODES:
        raise ValueError(f"explain must be one of {EXPLAIN_MODES}, got {wanted!r}")
    return "none" if sentiment_model.cfg.mask_kind == "none" else wanted


def build_wrappers(nli_model: NLIModel, sentiment_model: SentimentModel,
                   explain: str = "separate") -> dict[str, nn.Module]:
    """Graph name -> wrapper module (eval mode) for an explain layout (see EXPLAIN_MODES)."""
    explain = explain_mode(sentiment_model, explain)
    sentiment = (SentimentExplainGraph if explain == "merged" else SentimentGraph)(sentiment_model)
    wrappers: dict[str, nn.Module] = {
        "encoder": EncoderGraph(nli_model.encoder),
        "nli": NLIGraph(nli_model),
        "sentiment": sentiment,
    }
    if explain == "separate":
        wrappers["sentiment_explain"] = SentimentExplainGraph(sentiment_model)
    elif explain == "merged":
        wrappers["sentiment_explain"] = sentiment
    return {name: w.eval() for name, w in wrappers.items()}


def export_fp32_graphs(nli_model: NLIModel, sentiment_model: SentimentModel, out: Path,
                       files: dict[str, str], explain: str = "separate",
                       chunk_cells: int | None = None) -> dict[str, Path]:
    """Write the fp32 graphs into `out` (names from `files`): three exports plus one extraction.

    sentiment.onnx is cut out of the explain graph (same inputs, a subset of the outputs). The
    encoder is NOT cut out of the NLI graph: there the exporter reads the shared batch size
    from the hypothesis inputs, so the premise branch is not self-contained. The attention is
    exported in query-row chunks of `chunk_cells` pairs (default ATTENTION_CHUNK_CELLS; 0: none).
    """
    vocab_size = nli_model.cfg.vocab_size
    for model in (nli_model, sentiment_model):  # the PyTorch reference stays unchunked
        model.encoder.chunk_cells = ATTENTION_CHUNK_CELLS if chunk_cells is None else chunk_cells
    try:
        return _export_fp32_graphs(nli_model, sentiment_model, out, files, explain, vocab_size)
    finally:
        for model in (nli_model, sentiment_model):
            model.encoder.chunk_cells = 0


def _export_fp32_graphs(nli_model: NLIModel, sentiment_model: SentimentModel, out: Path,
                        files: dict[str, str], explain: str, vocab_size: int) -> dict[str, Path]:
    paths = {
        "encoder": export_graph(EncoderGraph(nli_model.encoder), out / files["encoder"], vocab_size),
        "nli": export_graph(NLIGraph(nli_model), out / files["nli"], vocab_size),
    }
    explain = explain_mode(sentiment_model, explain)
    if explain == "none":  # no attention maps to explain: plain graph only
        paths["sentiment"] = export_graph(SentimentGraph(sentiment_model), out / files["sentiment"],
                                          vocab_size)
    elif explain == "merged":  # one file serves both: sentiment.onnx with the explain outputs
        paths["sentiment"] = paths["sentiment_explain"] = export_graph(
            SentimentExplainGraph(sentiment_model), out / files["sentiment"], vocab_size)
    else:
        explain = export_graph(SentimentExplainGraph(sentiment_model), out / files["sentiment_explain"],
                               vocab_size)
        paths["sentiment"] = extract(explain, out / files["sentiment"], SentimentGraph.input_names,
                                     SentimentGraph.output_names)
        paths["sentiment_explain"] = explain
    return paths
