"""The model side of serving: a bundle's runtime, warmed up, and one micro-batcher per graph,
built by each worker for its own onnxruntime calls (service.inference.engine).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from disan.runtime.runtime import Runtime
from service.backend.batcher import BatchStats, MicroBatcher
from service.common.batching_defaults import Batching
from service.settings import Settings

# After the drain deadline, how long the batchers may take to finish the onnxruntime calls already
# running (their callers were answered 503 at the deadline).
STOP_GRACE_S = 2.0
# Explain graphs: their answers and memory grow with tokens^2 (attention maps, leave-one-out rows).
_EXPLAIN_GRAPHS = ("encoder_explain", "nli_encoder_explain", "sentiment_explain")


def load_runtime(settings: Settings) -> Runtime:
    """The bundle's sessions, warmed up."""
    runtime = Runtime(settings.bundle, settings.runtime_options())
    runtime.warmup()
    # The explain graphs' memory grows with the square of the longest sentence (attention
    # maps, leave-one-out rows); one call each at max_tokens takes it now, so no request grows
    # a ready worker's RSS by that much (the other graphs need little more at max_tokens:
    # bench/RESULTS.md).
    runtime.warm_explain([[1] * runtime.max_tokens])
    return runtime


def make_batchers(runtime: Runtime, settings: Settings, batching: Batching, executor: ThreadPoolExecutor,
                  stats: BatchStats, queue_limit: int) -> dict[str, MicroBatcher]:
    """One micro-batcher per graph of `runtime` (not started)."""
    # by graph, not route: where /embed and /nli share an encoder graph they share its batches
    runners: dict[str, tuple[Any, Any]] = {
        "encoder": (partial(runtime.encode_with, "encoder"), len),
        "encoder_explain": (partial(runtime.per_row, "encoder_explain"), len),
        "nli_encoder": (partial(runtime.encode_with, "nli_encoder"), len),
        "nli_encoder_explain": (partial(runtime.per_row, "nli_encoder_explain"), len),
        # a head payload is one pair (vectors) or an explained pair's rows (matrices)
        "nli_head": (runtime.nli_head, lambda pair: len(pair[0]) if np.ndim(pair[0]) == 2 else 1),
        "sentiment": (runtime.sentiment, len),
        "sentiment_explain": (runtime.explain, len),
    }
    batchers = {}
    for name in runtime.graphs:
        fn, length = runners[name]
        # Explain calls are rare and each one's memory is large (attention maps): one at a time
        # bounds what onnxruntime's arena grows to for them (bench/RESULTS.md, chaos).
        concurrency = 1 if name in _EXPLAIN_GRAPHS else runtime.batch_concurrency
        batchers[name] = MicroBatcher(
            name, fn, length=length, max_batch_size=batching.max_batch_size, max_wait_ms=settings.max_wait_ms,
            max_batch_cells=batching.max_batch_cells, queue_limit=queue_limit,
            concurrency=concurrency, executor=executor, stats=stats)
    return batchers
