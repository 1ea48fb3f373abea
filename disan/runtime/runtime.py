"""A loaded bundle: its graphs' onnxruntime sessions, routes and numpy in/out (TORCH-FREE). The
session plumbing (options, providers, threads, one graph) is `disan.runtime.ort_session`.

Used by everything that runs a bundle: the service, `disan eval`, the benches. It reads no
environment and no service settings: callers pass a frozen `RuntimeOptions` (the service builds
one from its Settings). The bundle contract is `disan.bundle.manifest`.

Which graphs run: the set of the provider that really loaded (a CUDA session that is actually
active -> the `gpu` set, else the `cpu` set) in that set's default variant (gpu: fp16, cpu: fp32).
`RuntimeOptions.variant` overrides the variant (taken from the other set when the chosen one
lacks it, e.g. fp16 on a CPU-only host) and `graph_set` the set. The embedding dim and the
providers actually in use are read from the live sessions, never assumed.

Which graph serves what follows the manifest's routes (`disan.bundle.manifest.routes`, `graph_for`):
`embed` runs the embed route's encoder (a distilled one in a bundle exported with `--embed`),
`nli` the NLI route's encoder (the NLI model's own) and then `nli_head`. Each graph reads text
through the bundle's word vocabulary or the subword tokenizer its manifest entry names
(`tokenizer(route)`): a distilled piece encoder beside word-level NLI and sentiment models.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.dimensions import load_projection
from disan.bundle.lexical import load_idf
from disan.bundle.manifest import (
    DEFAULT_LABELS,
    GRAPHS,
    TOKEN_AXES,
    BundleError,
    GraphTokenizers,
    graph_tokenizer,
    load_manifest,
    routes,
    variant_files,
)
from disan.runtime.ort_session import (  # RuntimeOptions is part of this module's API too
    CPU,
    CUDA,
    Graph,
    RuntimeOptions,
    choose_graphs,
    cuda_active,
    preload_cuda,
    requested_providers,
)
from disan.text.pieces import AnyTokenizer
from disan.text.tokenizer import Vocab

__all__ = ["ExplainFlags", "Runtime", "RuntimeOptions", "load_offline"]

log = logging.getLogger("disan.runtime.runtime")


class ExplainFlags:
    """Which graph serves which route, and which explanations the loaded graphs can give
    (`graphs`: the names of the loaded graphs; `manifest`: the bundle's)."""

    graphs: Any
    manifest: dict[str, Any]

    @property
    def routes(self) -> dict[str, str]:
        """Route -> graph (disan.bundle.manifest.routes): e.g. "embed" -> "encoder", "nli" ->
        "nli_encoder"."""
        return routes(self.manifest)

    def graph_for(self, route: str) -> str:
        """The graph serving `route` ("embed", "nli", "nli_head", "sentiment", "<route>_explain")."""
        return self.routes[route]

    @property
    def has_explain(self) -> bool:
        """Whether /sentiment can explain (attention maps, gates, token weights)."""
        return self.graph_for("sentiment_explain") in self.graphs

    @property
    def has_embed_explain(self) -> bool:
        """Whether /embed can explain (token weights)."""
        return self.graph_for("embed_explain") in self.graphs

    @property
    def has_nli_explain(self) -> bool:
        """Whether /nli can explain (token attribution through the NLI route's encoder)."""
        return self.graph_for("nli_explain") in self.graphs


class Runtime(ExplainFlags):
    """A loaded bundle: vocab, the sessions of one graph set, labels and limits."""

    def __init__(self, bundle_dir: str | Path, options: RuntimeOptions | None = None):
        options = options or RuntimeOptions()
        self.bundle_dir = Path(bundle_dir)
        self.manifest = load_manifest(self.bundle_dir)  # raises BundleError; verifies sha256
        vocab_file = self.bundle_dir / str(self.manifest.get("vocab", "vocab.json"))
        try:
            self.vocab = Vocab.load(vocab_file)
        except (OSError, ValueError) as exc:
            raise BundleError(f"{vocab_file}: cannot load vocab ({exc})") from exc
        self.vocab.spelling = options.spelling
        if options.spelling:
            self.vocab.index_spelling()  # now, not on the first request with a misspelt word
        self.tokenizers = GraphTokenizers(self.bundle_dir, self.manifest, {vocab_file.name: self.vocab})
        providers = requested_providers(options.providers)
        if CUDA in providers:
            preload_cuda()
        self.graphs: dict[str, Graph] = {}
        self.graph_set, self.variant = choose_graphs(self.manifest, options, CUDA in providers)
        if CUDA in providers:
            # Load one graph with CUDA first: if CUDA does not really come up, the CPU set (and
            # the CPU call layout) fit better than GPU graphs on a CPU fallback.
            first = self._load("encoder", options, providers)
            if not cuda_active(first.session):
                log.warning("CUDA was requested but unavailable; running the cpu graph set on %s",
                            first.provider)
                providers = [CPU]
                self.graph_set, self.variant = choose_graphs(self.manifest, options, cuda=False)
                self.graphs.clear()
        files = variant_files(self.manifest, self.graph_set, self.variant)
        for name in GRAPHS:
            if name in files and name not in self.graphs:
                self._load(name, options, providers)
        self.labels: dict[str, list[str]] = {}
        for name, entry in self.manifest["graphs"].items():
            task = GRAPHS[name].task if name in GRAPHS else None
            if task in DEFAULT_LABELS and task not in self.labels and entry.get("labels"):
                self.labels[task] = list(entry["labels"])
        for task, default in DEFAULT_LABELS.items():
            self.labels.setdefault(task, list(default))
        bundle_max = self.manifest.get("max_len")
        limits = [int(n) for n in (options.max_tokens, bundle_max) if n]
        if not limits:
            raise BundleError(f"{self.bundle_dir}: the manifest has no max_len; pass max_tokens")
        self.max_tokens = min(limits)
        self.name = (options.model_name or self.manifest.get("name") or self.bundle_dir.resolve().name)
        self.dim = int(self.embed([[1]]).shape[1])
        # `dimensions=m` through principal axes, or None: the first m components (disan.bundle.dimensions)
        self.projection = load_projection(self.bundle_dir, self.manifest, self.dim)
        # the IDF of sparse vectors (POST /embed_sparse), or None: no lexical table (disan.bundle.lexical)
        self.idf = load_idf(self.bundle_dir, self.manifest, len(self.tokenizer("embed")))

    def _load(self, name: str, options: RuntimeOptions, providers: list[str]) -> Graph:
        file = variant_files(self.manifest, self.graph_set, self.variant)[name]
        self.graphs[name] = Graph(name, self.bundle_dir / file, options, providers)
        try:
            self.tokenizers(name)  # now: a bundle that cannot read a graph's text does not load
        except Exception as exc:  # a missing package says which extra; a bad file, which file
            raise BundleError(f"{self.bundle_dir / graph_tokenizer(self.manifest, name)}: cannot load "
                              f"the tokenizer of graph {name} ({exc})") from exc
        return self.graphs[name]

    def tokenizer(self, route: str = "embed") -> AnyTokenizer:
        """How texts become the ids of `route`'s graph: the bundle's word vocabulary, or the
        subword tokenizer the manifest names for that graph (disan.bundle.manifest.graph_tokenizer)."""
        return self.tokenizers(self.graph_for(route))

    @property
    def provider(self) -> str:
        return self.graphs["encoder"].provider

    @property
    def providers(self) -> dict[str, str]:
        """Graph -> execution provider actually in use."""
        return {name: g.provider for name, g in self.graphs.items()}

    @property
    def batch_concurrency(self) -> int:
        """ORT calls the batchers keep in flight per graph (see `call_layout`)."""
        return self.graphs["encoder"].concurrency

    @staticmethod
    def _pad(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        # Text given where token ids belong used to fail deep in numpy ("invalid literal for int()").
        if any(isinstance(row, str) for row in rows):
            raise TypeError("the runtime takes token id rows (lists of ints), not text: use "
                            "disan.Encoder(bundle).encode(texts), or runtime.text_ids(text) per text")
        enc = Vocab.pad(rows)
        return enc.ids, enc.mask

    def encode_with(self, graph: str, rows: list[list[int]]) -> np.ndarray:
        """Token id rows -> the sentence vectors float32 [B, D] of encoder graph `graph`."""
        return self.graphs[graph].run(*self._pad(rows))[0]

    def embed(self, rows: list[list[int]]) -> np.ndarray:
        """Token id rows -> sentence embeddings float32 [B, D] (the embed route's encoder)."""
        return self.encode_with(self.graph_for("embed"), rows)

    def nli_embed(self, rows: list[list[int]]) -> np.ndarray:
        """Token id rows -> the NLI model's sentence vectors, what nli_head takes (the nli route's
        encoder: the embed route's too unless the bundle has a distilled encoder)."""
        return self.encode_with(self.graph_for("nli"), rows)

    def nli_head(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """(premise, hypothesis) vector pairs -> class probabilities: a [D] pair gives [K], a
        pair of [m, D] matrices (m rows of one explained pair) gives [m, K]. One graph call: the
        head's step of `disan.runtime.encoder.nli_steps`, the one NLI path."""
        us = [np.atleast_2d(u) for u, _ in pairs]
        vs = [np.atleast_2d(v) for _, v in pairs]
        probs = self.graphs[self.graph_for("nli_head")].run(np.concatenate(us), np.concatenate(vs))[0]
        parts = np.split(probs, np.cumsum([len(u) for u in us])[:-1])
        return [part if np.ndim(u) == 2 else part[0] for part, (u, _) in zip(parts, pairs, strict=True)]

    def sentiment(self, rows: list[list[int]]) -> np.ndarray:
        """Token id rows -> class probabilities [B, K]."""
        return self.graphs[self.graph_for("sentiment")].run(*self._pad(rows))[0]

    def per_row(self, graph: str, rows: list[list[int]]) -> list[dict[str, np.ndarray]]:
        """Every output of a sentence graph per row, token axes cut to the row's own length."""
        outs = self.graphs[graph].run(*self._pad(rows))
        names = GRAPHS[graph].outputs
        result = []
        for i, row in enumerate(rows):
            n = len(row)
            result.append({key: arr[i][tuple(slice(0, n) for _ in range(TOKEN_AXES.get(key, 0)))]
                           for key, arr in zip(names, outs, strict=True)})
        return result

    def explain(self, rows: list[list[int]]) -> list[dict[str, np.ndarray]]:
        """Sentiment per row: probs, attn_fw/attn_bw [n,n], gate_fw/gate_bw/s2t [n]."""
        return self.per_row(self.graph_for("sentiment_explain"), rows)

    def embed_explain(self, rows: list[list[int]]) -> list[dict[str, np.ndarray]]:
        """Encoder per row: embedding [D], s2t [n], loo_embedding [n,D] (see disan.bundle.manifest)."""
        return self.per_row(self.graph_for("embed_explain"), rows)

    def nli_explain(self, rows: list[list[int]]) -> list[dict[str, np.ndarray]]:
        """`embed_explain` of the NLI route's encoder (what /nli's explanation runs on)."""
        return self.per_row(self.graph_for("nli_explain"), rows)

    def text_ids(self, text: str, route: str = "embed") -> list[int]:
        """Raw text -> `route`'s token ids cut to `max_tokens` (the offline path; the service
        checks limits)."""
        return self.tokenizer(route).text_ids(text, self.max_tokens)

    def warmup(self) -> None:
        """Run every graph once on a few shapes so first requests do not pay allocation costs."""
        for n in (1, 8, min(32, self.max_tokens)):
            rows = [[1] * n, [1] * max(1, n // 2)]
            u = self.nli_embed(rows)
            self.nli_head(list(zip(u, u, strict=True)))
            self.sentiment(rows)
            if self.graph_for("embed") != self.graph_for("nli"):
                self.embed(rows)
            self.warm_explain(rows)

    def warm_explain(self, rows: list[list[int]]) -> None:
        """Run each explain graph the bundle has once on `rows` (a graph two routes share, once)."""
        if self.has_explain:
            self.explain(rows)
        if self.has_embed_explain:
            self.embed_explain(rows)
        if self.has_nli_explain and self.graph_for("nli_explain") != self.graph_for("embed_explain"):
            self.nli_explain(rows)


def load_offline(bundle: str | Path, variant: str = "auto", threads: int = 0,
                 graph_set: str = "auto") -> Runtime:
    """The runtime the service uses, on CPU, one call at a time (eval, transfer, benches).

    `threads` ORT intra-op threads per call (0: onnxruntime's choice); `variant`/`graph_set`
    as in RuntimeOptions (auto on CPU: the cpu set in fp32).
    """
    return Runtime(bundle, RuntimeOptions(providers="cpu", variant=variant,  # type: ignore[arg-type]
                                          intra_op_threads=threads, graph_set=graph_set))  # type: ignore[arg-type]
