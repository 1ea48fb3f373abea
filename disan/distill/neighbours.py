"""Batches of neighbouring sentences (TORCH-FREE): `disan pretrain --neighbour-group`.

In a batch of random corpus sentences almost every two are unrelated, so the distillation loss's
in-batch terms (InfoNCE, --relational) mostly teach that unrelated sentences are far apart. Built
from groups of sentences that lie close together in the teacher's space, a batch holds related
pairs too: the contrastive term must tell near sentences apart, and the relational term sees the
range of cosines that STS scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from disan.runtime.batching import length_batches


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)


def _plus_plus(unit: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeds: each next seed is drawn with weight its distance to the nearest seed so far,
    so two seeds seldom start inside one cluster."""
    n = len(unit)
    seeds = [int(rng.integers(n))]
    distance = np.full(n, np.inf, dtype=np.float32)
    for _ in range(1, k):
        distance = np.minimum(distance, 1.0 - unit @ unit[seeds[-1]])
        weights = np.clip(distance, 0.0, None).astype(np.float64)
        total = weights.sum()
        seeds.append(int(rng.choice(n, p=weights / total)) if total > 0 else int(rng.integers(n)))
    return unit[seeds]


def _kmeans(unit: np.ndarray, k: int, rng: np.random.Generator, iters: int) -> np.ndarray:
    """Cluster labels of the rows of `unit` (already L2-normalised float32)."""
    k = max(1, min(k, len(unit)))
    centroids = _plus_plus(unit, k, rng)
    for _ in range(iters):
        labels = (unit @ centroids.T).argmax(1)                                    # [N, k] -> [N]
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, unit)
        empty = np.bincount(labels, minlength=k) == 0
        # An empty cluster restarts at a random row instead of collapsing to zero.
        sums[empty] = unit[rng.choice(len(unit), int(empty.sum()))]
        centroids = _normalise(sums)
    return (unit @ centroids.T).argmax(1)


def neighbour_clusters(vectors: np.ndarray, rng: np.random.Generator, cluster_size: int = 64,
                       coarse: int = 64, iters: int = 5) -> list[np.ndarray]:
    """Row indices of clusters of about `cluster_size` neighbouring rows.

    Two levels (`coarse` clusters, then each split to the size asked for) so that the cost stays
    a few passes over the vectors however many clusters there are. The vectors are normalised
    once, here.
    """
    unit = _normalise(vectors)
    top = _kmeans(unit, coarse, rng, iters)
    clusters: list[np.ndarray] = []
    for c in range(int(top.max()) + 1):
        members = np.flatnonzero(top == c)
        if len(members) <= cluster_size:
            clusters += [members] if len(members) else []
            continue
        sub = _kmeans(unit[members], len(members) // cluster_size, rng, iters)
        clusters += [members[sub == s] for s in range(int(sub.max()) + 1) if (sub == s).any()]
    return clusters


def neighbour_batches(vectors: np.ndarray, lengths: Sequence[int], batch_size: int, group: int,
                      rng: np.random.Generator, cluster_size: int = 64,
                      chunk_batches: int = 50) -> list[np.ndarray]:
    """Batches of `batch_size // group` groups of up to `group` rows from one cluster each (a
    cluster's last group may be short).

    Every row is in exactly one batch. Groups are cut from each cluster after sorting it by
    length, and groups of similar length share a batch (`length_batches` over the groups, by
    their longest row), because DiSAN pays for the padding of its longest sentence.
    """
    if group < 1 or batch_size < 1:
        raise ValueError(f"--neighbour-group {group} / --batch-size {batch_size}: both must be at least 1")
    lengths = np.asarray(lengths)
    groups: list[np.ndarray] = []
    for members in neighbour_clusters(vectors, rng, cluster_size):
        members = rng.permutation(members)
        members = members[np.argsort(lengths[members], kind="stable")]
        groups += [members[i:i + group] for i in range(0, len(members), group)]
    longest = [int(lengths[g].max()) for g in groups]
    return [np.concatenate([groups[i] for i in batch])
            for batch in length_batches(longest, max(1, batch_size // group), rng, chunk_batches)]
