"""onnxruntime sessions for a bundle: provider selection, numpy in/out (TORCH-FREE).

Used by everything that runs a bundle: the service, `disan eval`, the benches. It reads no
environment and no service settings: callers pass a frozen `RuntimeOptions` (the service builds
one from its Settings). The bundle contract is `disan.manifest`; from the manifest the runtime
reads, tolerantly: ``graphs.<name>`` (a file name, or a dict with ``file``, optional ``labels``
and ``variants.<fp16|int8>``), ``labels.<task>``, ``max_len``, ``name``, ``vocab`` (file name,
default ``vocab.json``). The embedding dim and the providers actually in use are read from the
live sessions, never assumed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from disan.manifest import DEFAULT_LABELS, GRAPHS, BundleError, load_manifest
from disan.optional import require
from disan.text import Vocab

ort = require("onnxruntime", "serve-cpu")

log = logging.getLogger("disan.runtime")

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


@dataclass(frozen=True)
class RuntimeOptions:
    """How to run a bundle. The defaults suit offline use: CPU or CUDA, one call at a time."""

    providers: Literal["auto", "cuda", "cpu"] = "auto"
    variant: Literal["fp32", "fp16", "int8"] = "fp32"
    intra_op_threads: int = 0                 # 0: 1 with batch_concurrency auto on CPU, else ORT's choice
    inter_op_threads: int = 0                 # 0: ORT's choice
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    ort_spinning: bool = False
    batch_concurrency: int = 1                # ORT calls in flight per graph; 0 = auto (see call_layout)
    workers: int = 1                          # processes sharing this host's cores (auto layout)
    max_tokens: int | None = None             # None: the bundle's max_len
    model_name: str | None = None             # None: the manifest's name
_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_ORT_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
               "tensor(float)": np.float32, "tensor(float16)": np.float16}


def requested_providers(choice: str) -> list[str]:
    """Provider list to ask onnxruntime for; `cuda` fails loudly if the wheel has no CUDA."""
    available = ort.get_available_providers()
    if choice == "cpu":
        return [CPU]
    if choice == "cuda" and CUDA not in available:
        raise BundleError("providers=cuda but this onnxruntime has no CUDAExecutionProvider "
                          "(install onnxruntime-gpu, or use --providers auto/cpu)")
    return [CUDA, CPU] if CUDA in available else [CPU]


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def call_layout(options: RuntimeOptions, providers: list[str]) -> tuple[int, int]:
    """(ORT calls in flight per graph, intra-op threads per call) for these options.

    `batch_concurrency=0` (auto): on CUDA one call at a time; on CPU one single-threaded call per
    core this worker owns (cores / workers), because onnxruntime's intra-op threads scale poorly
    on the service's small batches (bench/RESULTS.md). Explicit values are kept as given.
    """
    threads, calls = options.intra_op_threads, options.batch_concurrency
    if calls > 0:
        return calls, threads
    if CUDA in providers:
        return 1, threads
    per_call = threads or 1
    return max(1, cpu_cores() // (options.workers * per_call)), per_call


def session_options(options: RuntimeOptions, intra_op_threads: int) -> ort.SessionOptions:
    """Intra-op threads per call (from `call_layout`); spinning, inter-op threads and graph
    optimisation level from the options."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = options.inter_op_threads
    opts.graph_optimization_level = _OPT_LEVELS[options.graph_optimization_level]
    spin = "1" if options.ort_spinning else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    opts.log_severity_level = 3  # warnings about unused initialisers etc. are noise in serving
    return opts


class Graph:
    """One ONNX graph: feeds by contract name (mapped by position), returns numpy outputs."""

    def __init__(self, name: str, path: Path, options: RuntimeOptions):
        self.name = name
        providers = requested_providers(options.providers)
        self.concurrency, threads = call_layout(options, providers)
        try:
            self.session = ort.InferenceSession(str(path), sess_options=session_options(options, threads),
                                                providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise BundleError(f"{path}: onnxruntime cannot load it ({exc})") from exc
        inputs = self.session.get_inputs()
        expected = GRAPHS[name].inputs
        if len(inputs) != len(expected):
            raise BundleError(f"{path}: expected {len(expected)} inputs {expected}, graph has "
                              f"{[i.name for i in inputs]}")
        self._inputs = [(i.name, _ORT_DTYPES.get(i.type, np.int64)) for i in inputs]
        self.output_names = [o.name for o in self.session.get_outputs()]
        active = self.session.get_providers()
        # ORT silently falls back to CPU when CUDA libraries fail to load: check what really runs.
        if options.providers == "cuda" and active[0] != CUDA:
            raise BundleError(f"{path}: providers=cuda but the session runs on {active[0]} "
                              "(CUDA/cuDNN libraries did not load)")
        if CUDA in providers and active[0] != CUDA:
            log.warning("%s: CUDA was requested but unavailable; running on %s", name, active[0])

    @property
    def provider(self) -> str:
        """The execution provider the live session actually uses."""
        return self.session.get_providers()[0]

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run with inputs in contract order; returns outputs in graph order."""
        feeds = {name: np.ascontiguousarray(a, dtype=dtype) for (name, dtype), a in
                 zip(self._inputs, arrays, strict=True)}
        return self.session.run(None, feeds)


def _graph_entry(manifest: dict[str, Any], name: str) -> dict[str, Any] | None:
    entry = manifest.get("graphs", {}).get(name)
    if entry is None:
        return None
    return {"file": entry} if isinstance(entry, str) else dict(entry)


class Runtime:
    """A loaded bundle: vocab, sessions, labels and limits."""

    def __init__(self, bundle_dir: str | Path, options: RuntimeOptions | None = None):
        options = options or RuntimeOptions()
        self.bundle_dir = Path(bundle_dir)
        self.manifest = load_manifest(self.bundle_dir)  # raises BundleError; verifies sha256
        vocab_file = self.bundle_dir / str(self.manifest.get("vocab", "vocab.json"))
        try:
            self.vocab = Vocab.load(vocab_file)
        except (OSError, ValueError) as exc:
            raise BundleError(f"{vocab_file}: cannot load vocab ({exc})") from exc
        self.graphs: dict[str, Graph] = {}
        self.labels: dict[str, list[str]] = {}
        for name, spec in GRAPHS.items():
            entry = _graph_entry(self.manifest, name)
            if entry is None:
                continue  # only the explain graph is optional (load_manifest checked the rest)
            file = entry.get("file", spec.file)
            if options.variant != "fp32":
                file = (entry.get("variants") or {}).get(options.variant)
                if file is None:
                    raise BundleError(f"{self.bundle_dir}: graph {name} has no {options.variant} variant "
                                      "(export with --fp16/--int8, or use --variant fp32)")
            self.graphs[name] = Graph(name, self.bundle_dir / file, options)
            task = spec.task
            labels = entry.get("labels") or (self.manifest.get("labels") or {}).get(task)
            if task in DEFAULT_LABELS and task not in self.labels:
                self.labels[task] = list(labels or DEFAULT_LABELS[task])
        bundle_max = self.manifest.get("max_len")
        limits = [int(n) for n in (options.max_tokens, bundle_max) if n]
        if not limits:
            raise BundleError(f"{self.bundle_dir}: the manifest has no max_len; pass max_tokens")
        self.max_tokens = min(limits)
        self.name = (options.model_name or self.manifest.get("name") or self.manifest.get("model_name")
                     or self.bundle_dir.resolve().name)
        self.dim = int(self.embed([[1]]).shape[1])

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

    @property
    def has_explain(self) -> bool:
        return "sentiment_explain" in self.graphs

    @staticmethod
    def _pad(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        enc = Vocab.pad(rows)
        return enc.ids, enc.mask

    def embed(self, rows: list[list[int]]) -> np.ndarray:
        """Token id rows -> sentence embeddings float32 [B, D]."""
        return self.graphs["encoder"].run(*self._pad(rows))[0]

    def nli(self, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
        """(premise ids, hypothesis ids) pairs -> class probabilities [B, 3]."""
        p_ids, p_mask = self._pad([p for p, _ in pairs])
        h_ids, h_mask = self._pad([h for _, h in pairs])
        return self.graphs["nli"].run(p_ids, p_mask, h_ids, h_mask)[0]

    def sentiment(self, rows: list[list[int]]) -> np.ndarray:
        """Token id rows -> class probabilities [B, K]."""
        return self.graphs["sentiment"].run(*self._pad(rows))[0]

    def explain(self, rows: list[list[int]]) -> list[dict[str, np.ndarray]]:
        """Per row: probs and attention maps trimmed to the row's own length."""
        outs = self.graphs["sentiment_explain"].run(*self._pad(rows))
        names = GRAPHS["sentiment_explain"].outputs
        result = []
        for i, row in enumerate(rows):
            item: dict[str, np.ndarray] = {}
            n = len(row)
            for key, arr in zip(names, outs, strict=False):
                a = arr[i]
                # attn_* are [n,n]; gates [n,d_h] and s2t [n]: cut the padded token axes only.
                item[key] = a if key == "probs" else a[:n, :n] if key.startswith("attn") else a[:n]
            result.append(item)
        return result

    def text_ids(self, text: str) -> list[int]:
        """Raw text -> token ids cut to `max_tokens` (the offline path; the service checks limits)."""
        return self.vocab.text_ids(text, self.max_tokens)

    def warmup(self) -> None:
        """Run every graph once on a few shapes so first requests do not pay allocation costs."""
        for n in (1, 8, min(32, self.max_tokens)):
            rows = [[1] * n, [1] * max(1, n // 2)]
            self.embed(rows)
            self.nli(list(zip(rows, rows, strict=True)))
            self.sentiment(rows)
            if self.has_explain:
                self.explain(rows)


def load_offline(bundle: str | Path, variant: str = "fp32", threads: int = 0) -> Runtime:
    """The runtime the service uses, on CPU, one call at a time (eval, transfer, benches).

    `threads` ORT intra-op threads per call (0: onnxruntime's choice).
    """
    return Runtime(bundle, RuntimeOptions(providers="cpu", variant=variant,  # type: ignore[arg-type]
                                          intra_op_threads=threads))
