"""Length-sorted batching (disan.runtime.batching): training batches, cell budgets."""

from __future__ import annotations

import numpy as np

from disan.runtime.batching import length_batches, split_by_cells


def test_length_batches_cover_everything_once_with_similar_lengths() -> None:
    lengths = np.random.default_rng(0).integers(1, 60, size=1000)
    batches = length_batches(lengths, 64, np.random.default_rng(1), chunk_batches=4)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1000)) and max(map(len, batches)) == 64
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 0.5 * np.mean([np.ptp(lengths[b]) for b in np.array_split(np.arange(1000), 16)])
    again = length_batches(lengths, 64, np.random.default_rng(1), chunk_batches=4)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))



def test_split_by_cells_keeps_an_oversized_single_item() -> None:
    assert split_by_cells([100], max_cells=10, max_size=4) == [range(0, 1)]
