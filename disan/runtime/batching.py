"""Length-sorted batching (TORCH-FREE): the one place that decides which rows share a batch.

DiSAN's token2token attention costs n^2 per sentence, so every consumer groups rows of similar
length: training (`length_batches`, shuffled), training evaluation (`sorted_batches`), offline encoding
(`cell_batches`) and the service's micro-batcher (`split_by_cells`, a padded-cells budget). The one
exception, distillation batches of sentences that are neighbours in the teacher's space, is
`disan.distill.neighbours` (which still lets groups of similar length share a batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def length_batches(lengths: Sequence[int], batch_size: int, rng: np.random.Generator,
                   chunk_batches: int = 50) -> list[np.ndarray]:
    """Shuffle, sort by length inside chunks of `chunk_batches` batches, cut, shuffle the batches.

    Similar lengths share a batch (little padding) while the order stays random.
    """
    perm = rng.permutation(len(lengths))
    lengths = np.asarray(lengths)
    batches: list[np.ndarray] = []
    step = batch_size * chunk_batches
    for start in range(0, len(perm), step):
        chunk = perm[start:start + step]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Evaluation batches: indices sorted by length, fixed order."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def split_by_cells(lengths: Sequence[int], max_cells: int, max_size: int) -> list[range]:
    """Cut ascending `lengths` into consecutive ranges with size * max_len^2 <= max_cells.

    A single item always forms a batch even if it alone exceeds the budget (the request limits,
    not the batcher, decide what is too long).
    """
    batches: list[range] = []
    start = 0
    for i, n in enumerate(lengths):
        size = i - start + 1
        if i > start and (size * n * n > max_cells or size > max_size):
            batches.append(range(start, i))
            start = i
    if start < len(lengths):
        batches.append(range(start, len(lengths)))
    return batches


@dataclass(frozen=True)
class BatchLimits:
    """Sentences per onnxruntime call and padded cells (batch x max_len^2) per call."""

    max_batch_size: int
    max_batch_cells: int


# Per execution provider (the names onnxruntime reports). Why these values: on a CPU small calls
# keep the [B, n, n, d] attention tensors in the caches; a GPU needs large calls to fill its cores
# (bench/RESULTS.md: bench/cells.py on CPU, bench/gpu.py on CUDA). The service's auto batching
# (service.common.batching_defaults) and disan.runtime.encoder both read them.
PROVIDER_DEFAULTS: dict[str, BatchLimits] = {
    "CPUExecutionProvider": BatchLimits(max_batch_size=64, max_batch_cells=4096),
    "CUDAExecutionProvider": BatchLimits(max_batch_size=1024, max_batch_cells=1 << 18),
}
# Providers without measured values (e.g. TensorRT, ROCm) get the CPU's: small calls are never
# wrong, only slower than they could be.
FALLBACK_PROVIDER = "CPUExecutionProvider"


def provider_limits(provider: str) -> BatchLimits:
    """The batch limits for the provider a session really runs on."""
    return PROVIDER_DEFAULTS.get(provider, PROVIDER_DEFAULTS[FALLBACK_PROVIDER])


def cell_batches(lengths: Sequence[int], limits: BatchLimits) -> list[np.ndarray]:
    """Indices of `lengths` sorted by length and cut as the service's batcher cuts a queue
    (`split_by_cells`): the offline encoders' batches (disan.runtime.encoder)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    ranked = [int(lengths[i]) for i in order]
    return [order[r.start:r.stop] for r in split_by_cells(ranked, limits.max_batch_cells,
                                                          limits.max_batch_size)]
