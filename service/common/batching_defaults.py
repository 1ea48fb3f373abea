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

# The per-provider values live in the core, beside the batching they drive, so disan.Encoder
# (`disan embed`) cuts its batches as the service does.
from disan.runtime.batching import FALLBACK_PROVIDER, PROVIDER_DEFAULTS, BatchLimits
from disan.runtime.ort_session import CPU, CUDA

__all__ = ["FALLBACK_PROVIDER", "PROVIDER_DEFAULTS", "BatchLimits", "Batching", "resolve_batching"]
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
