"""onnxruntime session plumbing for a bundle's graphs (TORCH-FREE): the options a caller passes,
providers (and CUDA preloading), how many calls run at once with how many threads each, one
loaded graph (`Graph`), and which graph set and variant to load (`choose_graphs`).

`disan.runtime.runtime.Runtime` builds on these; it holds the routes and the numpy in/out of a bundle.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import numpy as np

from disan.bundle.manifest import GRAPH_SETS, GRAPHS, BundleError, available_variants
from disan.optional import require

ort = require("onnxruntime", "serve-cpu")

log = logging.getLogger("disan.runtime.runtime")  # the runtime's logger name, as before the split

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"

# The choices of each option, written once: RuntimeOptions, the service's settings and the CLIs
# (`typing.get_args(Providers)`) all read them from here.
Providers = Literal["auto", "cuda", "cpu"]               # auto: CUDA where it really loads, else CPU
Variant = Literal["auto", "fp32", "fp16", "int8"]        # auto: the graph set's default
GraphSet = Literal["auto", "cpu", "gpu"]                 # auto: the set of the live provider
OptimizationLevel = Literal["disable", "basic", "extended", "all"]


@dataclass(frozen=True)
class RuntimeOptions:
    """How to run a bundle. The defaults suit offline use: CPU or CUDA, one call at a time."""

    providers: Providers = "auto"
    variant: Variant = "auto"
    graph_set: GraphSet = "auto"
    intra_op_threads: int = 0                 # 0: 1 with batch_concurrency auto on CPU, else ORT's choice
    inter_op_threads: int = 0                 # 0: ORT's choice
    graph_optimization_level: OptimizationLevel = "all"
    ort_spinning: bool = False
    batch_concurrency: int = 1                # ORT calls in flight per graph; 0 = auto (see call_layout)
    workers: int = 1                          # processes sharing this host's cores (auto layout)
    max_tokens: int | None = None             # None: the bundle's max_len
    model_name: str | None = None             # None: the manifest's name
    spelling: bool = True                     # a misspelt unknown word read as a known one (Vocab.spelled)

    def __post_init__(self) -> None:
        """Refuse what a field's type does not allow, naming the field. The service's settings
        check the same types with pydantic; an offline caller (`disan.Encoder`, `load_offline`) would
        otherwise run "tpu" as "auto", or hand onnxruntime a negative thread count."""
        for name, choices in _CHOICES.items():
            if (value := getattr(self, name)) not in choices:
                raise ValueError(f"{name}={value!r}: one of {', '.join(choices)}")
        for name, least in _AT_LEAST.items():
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"{name}={value!r}: at least {least}")


# the Literal fields' choices, read off the class so they are written once
_CHOICES = {name: get_args(hint) for name, hint in get_type_hints(RuntimeOptions).items()
            if get_origin(hint) is Literal}
_AT_LEAST = {"intra_op_threads": 0, "inter_op_threads": 0, "batch_concurrency": 0, "workers": 1,
             "max_tokens": 1}
_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_ORT_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
               "tensor(float)": np.float32, "tensor(float16)": np.float16}


_preloaded = False


def preload_cuda() -> None:
    """Load CUDA and cuDNN from their PyPI wheels (nvidia-*) before the first CUDA session, so
    onnxruntime-gpu finds them on a host that has only the NVIDIA driver.

    `onnxruntime.preload_dlls()` exists from onnxruntime-gpu 1.21; without the wheels it falls
    back to the default library paths (a CUDA base image), so calling it is always safe.
    """
    global _preloaded
    if _preloaded or not hasattr(ort, "preload_dlls"):
        return
    _preloaded = True
    try:
        ort.preload_dlls()
    except OSError as exc:  # a library found but not loadable: the session check reports the rest
        log.warning("onnxruntime.preload_dlls() failed: %s", exc)


def cuda_active(session: ort.InferenceSession) -> bool:
    """Whether a live session really runs on CUDA (ORT falls back to CPU silently)."""
    return session.get_providers()[0] == CUDA


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

    def __init__(self, name: str, path: Path, options: RuntimeOptions, providers: list[str]):
        self.name = name
        self.file = path.name
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
        # ORT silently falls back to CPU when CUDA libraries fail to load: check what really runs.
        if options.providers == "cuda" and not cuda_active(self.session):
            raise BundleError(f"{path}: providers=cuda but the session runs on {self.provider} "
                              "(CUDA/cuDNN libraries did not load: install onnxruntime-gpu[cuda,cudnn] "
                              "or use a CUDA base image)")

    @property
    def provider(self) -> str:
        """The execution provider the live session actually uses."""
        return self.session.get_providers()[0]

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run with inputs in contract order; returns outputs in graph order."""
        feeds = {name: np.ascontiguousarray(a, dtype=dtype) for (name, dtype), a in
                 zip(self._inputs, arrays, strict=True)}
        return self.session.run(None, feeds)


def choose_graphs(manifest: dict[str, Any], options: RuntimeOptions, cuda: bool) -> tuple[str, str]:
    """(graph set, variant) to load: see the module docstring."""
    sets = manifest["sets"]
    if options.graph_set != "auto":
        if options.graph_set not in sets:
            raise BundleError(f"graph set {options.graph_set!r} is not in this bundle "
                              f"(it has {sorted(sets)})")
        order = [options.graph_set]
    else:
        preferred = "gpu" if cuda else "cpu"
        order = [preferred] + [s for s in GRAPH_SETS if s != preferred]
    for set_name in order:
        if set_name not in sets:
            continue
        variant = sets[set_name]["default_variant"] if options.variant == "auto" else options.variant
        if variant in sets[set_name]["variants"]:
            return set_name, variant
    have = ", ".join(f"{s}/{v}" for s, v in available_variants(manifest))
    raise BundleError(f"no {options.variant} graphs in {order} (this bundle has {have}; export with "
                      "--quantize int8 for int8, without --no-fp16 for fp16, or use --variant auto)")
