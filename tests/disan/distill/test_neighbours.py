"""disan.distill.neighbours: batches of sentences that are neighbours in the teacher's space."""

from __future__ import annotations

import numpy as np
import pytest

from disan.distill.neighbours import neighbour_batches, neighbour_clusters


def _blobs(n_per: int = 40, k: int = 6, dim: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, dim))
    truth = np.repeat(np.arange(k), n_per)
    vectors = centres[truth] + 0.1 * rng.standard_normal((len(truth), dim))
    order = rng.permutation(len(truth))
    return vectors[order].astype(np.float16), truth[order]


def test_kmeans_recovers_separated_clusters() -> None:
    vectors, truth = _blobs()
    clusters = neighbour_clusters(vectors, np.random.default_rng(1), cluster_size=40, coarse=6, iters=10)
    for members in clusters:  # every found cluster lies inside one true one
        assert len(set(truth[members])) <= 1


def test_every_row_once_and_neighbours_share_batches() -> None:
    vectors, truth = _blobs()
    lengths = np.random.default_rng(2).integers(3, 30, len(vectors))
    batches = neighbour_batches(vectors, lengths, batch_size=16, group=8, rng=np.random.default_rng(3),
                                cluster_size=20)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(vectors)))
    same = np.mean([np.mean(truth[b][:, None] == truth[b][None, :]) for b in batches])
    # random batches of 16 from 6 equal clusters share a cluster ~1/6 of the time
    assert same > 0.4


def test_groups_of_similar_length_share_a_batch() -> None:
    vectors, _ = _blobs(n_per=200)
    lengths = np.random.default_rng(4).integers(1, 100, len(vectors))
    rng = np.random.default_rng(5)
    batches = neighbour_batches(vectors, lengths, batch_size=32, group=8, rng=rng, cluster_size=40)
    padded = sum(len(b) * lengths[b].max() for b in batches)
    shuffled = rng.permutation(len(vectors))
    random = sum(32 * lengths[shuffled[i:i + 32]].max() for i in range(0, len(vectors), 32))
    assert padded < 0.8 * random


def test_a_group_below_one_is_refused_not_looped_on() -> None:
    # A negative group once cut no groups at all, so the distillation loop made no batches and
    # re-clustered forever: a hang instead of an error.

    vectors, _ = _blobs()
    with pytest.raises(ValueError, match="--neighbour-group -1"):
        neighbour_batches(vectors, [5] * len(vectors), batch_size=16, group=-1, rng=np.random.default_rng(0))
