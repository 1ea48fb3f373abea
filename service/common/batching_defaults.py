"""Batching limits that follow the execution provider that really loaded.

`max_batch_size` and `max_batch_cells` default to 0 (= auto) in `service.settings.Settings`. Once
the runtime has loaded, `resolve_batching` picks the values for the provider its sessions really
run on (onnxruntime falls back from CUDA to CPU when the CUDA libraries do not load, so the
request alone says nothing). A value set explicitly (flag or DISAN_* variable) always wins.
`/info` reports the resolved values and where each came from.

Why these values: on a CPU small calls keep the [B, n, n, d] attention tensors in the caches; a
GPU needs large calls to fill its cores. The measurements behind each provider's values are in
bench/RESULTS.md (CPU: `bench/cells.py`; CUDA: the sweep of `bench/gpu.py` on an H100,
bench/gpu.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from disan.bundle.manifest import BundleError

# The per-provider values live in the core, beside the batching they drive, so disan.Encoder
# (`disan embed`) cuts its batches as the service does.
from disan.runtime.batching import FALLBACK_PROVIDER, PROVIDER_DEFAULTS, BatchLimits
from disan.runtime.ort_session import CPU, CUDA, requested_providers

__all__ = ["FALLBACK_PROVIDER", "PROVIDER_DEFAULTS", "BatchLimits", "Batching", "resolve_batching",
           "resolve_inference_process"]
_SHORT = {CPU: "CPU", CUDA: "CUDA"}


@dataclass(frozen=True)
class Batching:
    """The limits the batchers use, and per knob why (`source`, reported by /info)."""

    max_batch_size: int
    max_batch_cells: int
    source: dict[str, str] = field(default_factory=dict)


def resolve_batching(max_batch_size: int, max_batch_cells: int, provider: str,
                     batch_concurrency: int = 0) -> Batching:
    """Settings' values (0 = auto) + the provider the sessions run on -> the limits to use.

    `batch_concurrency` is resolved by the runtime (disan.runtime.ort_session.call_layout); here only its
    source is recorded, so /info explains all three knobs in one place.
    """
    known = provider in PROVIDER_DEFAULTS
    defaults = PROVIDER_DEFAULTS[provider if known else FALLBACK_PROVIDER]
    auto = (f"auto: {_SHORT.get(provider, provider)} default" if known
            else f"auto: {_SHORT[FALLBACK_PROVIDER]} default (no values for {provider})")
    source = {
        "max_batch_size": "set explicitly" if max_batch_size else auto,
        "max_batch_cells": "set explicitly" if max_batch_cells else auto,
        "batch_concurrency": "set explicitly" if batch_concurrency else
        "auto: 1 call at a time on CUDA, one single-threaded call per core of the worker on CPU",
    }
    return Batching(max_batch_size=max_batch_size or defaults.max_batch_size,
                    max_batch_cells=max_batch_cells or defaults.max_batch_cells, source=source)


# Where the onnxruntime calls of several workers run, per provider, when `inference_process` is
# auto: "off" = each worker its own runtime and batches; "shared" = one inference process that
# all workers feed (service.backend.inference_process). From the measurements in bench/RESULTS.md
# ("Several workers on one GPU"; on CUDA bench/gpu.py's service part, bench/gpu.json).
INFERENCE_PROCESS_DEFAULTS: dict[str, tuple[str, str]] = {
    CPU: ("off", "CPU: per-worker runtimes measured faster than the shared process on 2 cores "
                 "(bench/RESULTS.md)"),
    CUDA: ("off", "CUDA: per-worker runtimes measured faster than the shared process at 8 and 12 "
                  "workers on an H100 (bench/RESULTS.md, bench/gpu.json)"),
}


def resolve_inference_process(mode: str, workers: int, providers: str, can_share: bool = True
                              ) -> tuple[str, str]:
    """(mode, why) for the `inference_process` setting: "off" or "shared".

    auto follows `INFERENCE_PROCESS_DEFAULTS` for the provider the runtime will ask for (CUDA when
    this onnxruntime has it; `disan serve` decides before anything loads, so it cannot wait for
    the provider that really comes up). `can_share` is False where no inference process was
    started for this worker (an app built outside `disan serve`): auto then stays per worker.
    """
    if mode != "auto":
        return mode, "set explicitly"
    if workers == 1:
        return "off", "auto: one worker, nothing to share"
    if not can_share:
        return "off", "auto: no inference process was started for this worker (not run by disan serve)"
    try:
        provider = CUDA if CUDA in requested_providers(providers) else CPU
    except BundleError:  # providers=cuda without CUDA: the runtime fails with the full message
        provider = CUDA
    chosen, why = INFERENCE_PROCESS_DEFAULTS[provider]
    return chosen, f"auto: {why}"
