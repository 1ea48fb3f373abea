"""Thin export wrappers around the models in `disan/model.py`, and the fp32 ONNX export.

The wrappers only pick outputs, apply the final softmax and cast to float32; every piece of
model math stays in `disan/model.py`. Graph names and I/O names follow `disan.bundle.manifest.GRAPHS`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from disan.bundle.manifest import GRAPHS, SENTENCE
from disan.model import DiSANEncoder, NLIModel, SentimentModel, pooled_without_each
from model_export.graphs.cache import cached_export
from model_export.graphs.onnx_files import extract

OPSET = 18  # >= 17 (LayerNorm etc.); 18 is what the dynamo exporter emits natively
# Example sizes for tracing: batch >= 2 and length >= 3 so torch.export never specialises an
# axis to 0/1 (sizes 0 and 1 are special-cased by the symbolic shape engine).
EXAMPLE_BATCH, EXAMPLE_LEN = 3, 5
# The CPU graph set computes the packed token2token attention in query-row chunks of about
# this many (batch x rows x tokens) pairs, an ONNX Scan (disan.model._pair_rows_in_chunks).
# 1024 was the fastest chunk with 1 ORT thread per call (the CPU compose setting); with more
# intra-op threads chunking does not help, and on a GPU it costs (bench/packing.py,
# bench/RESULTS.md), so the GPU set is exported unchunked.
ATTENTION_CHUNK_CELLS = 1024


class SentenceGraph(nn.Module):
    """Base of the graphs fed one sentence batch: ids [B,n] int64, mask [B,n] bool."""

    graph = ""

    @property
    def input_names(self) -> tuple[str, ...]:
        return GRAPHS[self.graph].inputs

    @property
    def output_names(self) -> tuple[str, ...]:
        return GRAPHS[self.graph].outputs

    def examples(self, vocab_size: int) -> tuple[tuple[Tensor, ...], tuple[dict, ...]]:
        """Example inputs for tracing and their dynamic axes."""
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        return example_inputs(2, vocab_size), ({0: batch, 1: seq}, {0: batch, 1: seq})


class EncoderGraph(SentenceGraph):
    """ids, mask -> embedding [B,D] (float32). `graph`: encoder, or nli_encoder (same I/O)."""

    graph = "encoder"

    def __init__(self, encoder: DiSANEncoder, graph: str = "encoder"):
        super().__init__()
        self.encoder = encoder
        self.graph = graph

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.encoder(ids, mask).float()


class EncoderExplainGraph(SentenceGraph):
    """ids, mask -> embedding [B,D], s2t [B,n] (source2token weight per token, mean over
    features), loo_embedding [B,n,D] (the embedding with each token left out of the pooling)."""

    graph = "encoder_explain"

    def __init__(self, encoder: DiSANEncoder, graph: str = "encoder_explain"):
        super().__init__()
        self.encoder = encoder
        self.graph = graph

    def forward(self, ids: Tensor, mask: Tensor):
        sent, ex = self.encoder(ids, mask, return_tokens=True)
        loo = pooled_without_each(ex["u"], ex["s2t_probs"], mask)
        return sent.float(), ex["s2t"].float(), loo.float()


class NLIHeadGraph(nn.Module):
    """premise_embedding, hypothesis_embedding [B,D] -> class probabilities [B,K] (float32).

    The [u; v; u-v; u*v] combination is inside (NLIModel.classify), not in the caller.
    """

    graph = "nli_head"
    input_names = GRAPHS["nli_head"].inputs
    output_names = GRAPHS["nli_head"].outputs

    def __init__(self, model: NLIModel):
        super().__init__()
        self.model = model

    def forward(self, u: Tensor, v: Tensor) -> Tensor:
        # softmax in float32 so the fp16 variant still returns well-normalised probabilities
        return torch.softmax(self.model.classify(u, v).float(), dim=-1)

    def examples(self, vocab_size: int) -> tuple[tuple[Tensor, ...], tuple[dict, ...]]:
        gen = torch.Generator().manual_seed(0)
        dim = self.model.encoder.out_dim
        batch = torch.export.Dim("batch")
        return (torch.randn(EXAMPLE_BATCH, dim, generator=gen),
                torch.randn(EXAMPLE_BATCH, dim, generator=gen)), ({0: batch}, {0: batch})


class NLIGraph(nn.Module):
    """The whole NLI model: premise/hypothesis ids+mask -> probs [B,K]. Not a bundle graph since
    format 2 (encoder + nli_head instead); the reference for their composition, and the graph
    of format-1 bundles (model_export.recover)."""

    input_names = ("premise_ids", "premise_mask", "hypothesis_ids", "hypothesis_mask")
    output_names = ("probs",)

    def __init__(self, model: NLIModel):
        super().__init__()
        self.model = model

    def forward(self, p_ids: Tensor, p_mask: Tensor, h_ids: Tensor, h_mask: Tensor) -> Tensor:
        return torch.softmax(self.model(p_ids, p_mask, h_ids, h_mask).float(), dim=-1)

    def examples(self, vocab_size: int) -> tuple[tuple[Tensor, ...], tuple[dict, ...]]:
        batch = torch.export.Dim("batch")
        s0, s1 = torch.export.Dim("seq0"), torch.export.Dim("seq1")
        # premise and hypothesis have independent lengths; ids and mask of one text share theirs
        return example_inputs(4, vocab_size), ({0: batch, 1: s0}, {0: batch, 1: s0},
                                               {0: batch, 1: s1}, {0: batch, 1: s1})


class SentimentGraph(SentenceGraph):
    """ids, mask -> class probabilities [B,K]."""

    graph = "sentiment"

    def __init__(self, model: SentimentModel):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return torch.softmax(self.model(ids, mask).float(), dim=-1)


class SentimentExplainGraph(SentenceGraph):
    """ids, mask -> probs [B,K], attn_fw, attn_bw [B,n,n], gate_fw, gate_bw, s2t [B,n].

    Attention maps are already averaged over features by the encoder; the fusion gates are
    averaged over features here (a display summary, not model math).
    """

    graph = "sentiment_explain"

    def __init__(self, model: SentimentModel):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, mask: Tensor):
        logits, ex = self.model.explain(ids, mask)
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
    """Export `module` (a *Graph wrapper) to a single-file ONNX model with dynamic axes (or copy
    the same graph from `$DISAN_GRAPH_CACHE`, model_export.graphs.cache)."""
    module = module.eval()
    return cached_export(module, path, vocab_size, opset, lambda: _trace(module, path, vocab_size, opset))


def _trace(module: nn.Module, path: Path, vocab_size: int, opset: int) -> Path:
    names: Sequence[str] = module.input_names
    args, dyn = module.examples(vocab_size)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # exporter chatter (deprecations, axis-name notes)
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(
            module, args, None, dynamo=True, opset_version=opset, input_names=list(names),
            dynamic_shapes=dyn, external_data=False, verbose=False,
        )
    _rename_outputs(program.model.graph, module.output_names)
    # one self-contained file here; the bundle's shared weights file is written afterwards
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


def has_attention(model: SentimentModel | NLIModel) -> bool:
    """Whether the encoder has DiSA blocks (attention maps, fusion gates): not the mask_kind='none'
    ablation, nor the multi-head / Bi-LSTM baseline encoders."""
    return model.cfg.mask_kind != "none" and model.cfg.encoder_kind == "disan"


def sentence_encoders(nli_model: NLIModel, embed: DiSANEncoder | None) -> dict[str, DiSANEncoder]:
    """Encoder graph name -> the encoder it exports: `encoder` is the distilled one if given
    (then the NLI model's own is `nli_encoder`), else the NLI model's."""
    if embed is None:
        return {"encoder": nli_model.encoder}
    return {"encoder": embed, "nli_encoder": nli_model.encoder}


def graph_source(graph: str, has_embed: bool) -> str:
    """Which model a graph is exported from: "embed" (the distilled encoder), "nli" or "sentiment"."""
    if has_embed and graph.split(".")[0] in ("encoder", "encoder_explain"):
        return "embed"
    return GRAPHS[graph.split(".")[0]].task


def build_wrappers(nli_model: NLIModel, sentiment_model: SentimentModel,
                   embed: DiSANEncoder | None = None) -> dict[str, nn.Module]:
    """Bundle graph name -> wrapper module (eval mode): the PyTorch reference of each graph."""
    wrappers: dict[str, nn.Module] = {}
    for name, encoder in sentence_encoders(nli_model, embed).items():
        wrappers[name] = EncoderGraph(encoder, name)
        wrappers[f"{name}_explain"] = EncoderExplainGraph(encoder, f"{name}_explain")
    wrappers["nli_head"] = NLIHeadGraph(nli_model)
    wrappers["sentiment"] = SentimentGraph(sentiment_model)
    if has_attention(sentiment_model):
        wrappers["sentiment_explain"] = SentimentExplainGraph(sentiment_model)
    return {name: w.eval() for name, w in wrappers.items()}


def export_fp32_graphs(nli_model: NLIModel, sentiment_model: SentimentModel, out: Path,
                       chunk_cells: int, embed: DiSANEncoder | None = None) -> dict[str, Path]:
    """Self-contained fp32 graphs in `out`, keyed by bundle file name.

    Unchunked (the GPU set; the explain graphs serve both sets): encoder_explain.onnx,
    sentiment_explain.onnx, nli_head.onnx, and encoder.onnx / sentiment.onnx cut out of the
    explain graphs (onnx.utils.Extractor keeps exactly the nodes an output needs: the same
    computation without the explain outputs, and one export less each). Chunked (the CPU set,
    when chunk_cells > 0 and the model has packed attention): encoder.chunked.onnx,
    sentiment.chunked.onnx. With a distilled encoder `embed`, the encoder graphs are its and
    nli_encoder(_explain).onnx and nli_encoder.chunked.onnx the NLI model's. Returns {file name: path}.
    """
    # example ids stay within every model's own table (the smallest: ids past it are UNK anyway)
    vocab_size = nli_model.cfg.vocab_size
    paths: dict[str, Path] = {}

    def save(name: str, module: nn.Module) -> None:
        paths[name] = export_graph(module, out / name, vocab_size)

    encoders = sentence_encoders(nli_model, embed)
    for graph, encoder in encoders.items():
        save(f"{graph}_explain.onnx", EncoderExplainGraph(encoder, f"{graph}_explain"))
        paths[f"{graph}.onnx"] = extract(paths[f"{graph}_explain.onnx"], out / f"{graph}.onnx",
                                         SENTENCE, ("embedding",))
    save("nli_head.onnx", NLIHeadGraph(nli_model))
    if has_attention(sentiment_model):
        save("sentiment_explain.onnx", SentimentExplainGraph(sentiment_model))
        paths["sentiment.onnx"] = extract(paths["sentiment_explain.onnx"], out / "sentiment.onnx",
                                          SENTENCE, ("probs",))
    else:
        save("sentiment.onnx", SentimentGraph(sentiment_model))
    chunked = {f"{graph}.chunked.onnx": (encoder, EncoderGraph(encoder, graph))
               for graph, encoder in encoders.items()}
    chunked["sentiment.chunked.onnx"] = (sentiment_model.encoder, SentimentGraph(sentiment_model))
    for name, (encoder, wrapper) in chunked.items():
        if chunk_cells > 0 and encoder.packed:
            with chunked_attention(wrapper, chunk_cells):  # the PyTorch reference stays unchunked
                save(name, wrapper)
    return paths


@contextmanager
def chunked_attention(module: nn.Module, chunk_cells: int) -> Iterator[None]:
    """Every encoder inside `module` (an ensemble has several) computes its packed attention in
    chunks of `chunk_cells` while the block runs, and unchunked again after."""
    encoders = [m for m in module.modules() if isinstance(m, DiSANEncoder)]
    for encoder in encoders:
        encoder.chunk_cells = chunk_cells
    try:
        yield
    finally:
        for encoder in encoders:
            encoder.chunk_cells = 0
