"""Hybrid ranking (`disan eval --retrieval DIR --hybrid W`), TORCH-FREE: numpy.

A document's score for a query is `(1 - W) * dense cosine + W * sparse dot`: the cosine of the
bundle's normalised `/embed` vectors and the dot product of its unit-length sparse lexical vectors
(`POST /embed_sparse`, `Encoder.encode_sparse`; disan.bundle.lexical), the sum a vector database
that stores both computes. The sparse side is exact: the documents' vectors are indexed by token
id (disan.bundle.lexical.Postings), and each query adds the weights of the documents that share its
ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from disan.bundle.lexical import Postings, SparseVector, hybrid_scores

Sparse = Callable[[list[str]], list[SparseVector]]


def hybrid_top_k(queries: np.ndarray, docs: np.ndarray, query_sparse: Sequence[SparseVector],
                 postings: Postings, weight: float, k: int, cells: int = 1 << 24
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best documents per query by `(1 - weight) * queries @ docs.T + weight * sparse dot`
    (the rows normalised by the caller): (indices int64 [Q, k'], scores float32 [Q, k']), best
    first, ties to the earlier document; k' = min(k, documents). At most about `cells` scores are
    held at a time."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"hybrid weight {weight}: from 0 to 1")
    n_q, n_d = len(queries), len(docs)
    k = min(k, n_d)
    step = max(1, cells // max(1, n_d))
    best_idx = np.zeros((n_q, k), dtype=np.int64)
    best_val = np.zeros((n_q, k), dtype=np.float32)
    for q0 in range(0, n_q, step):
        dense = queries[q0:q0 + step] @ docs.T
        rows = range(q0, q0 + len(dense))
        block = hybrid_scores(dense, weight, lambda rows=rows: np.stack([postings.scores(query_sparse[q])
                                                                          for q in rows]))
        idx = np.argpartition(-block, k - 1, axis=1)[:, :k]
        val = np.take_along_axis(block, idx, 1)
        order = np.lexsort((idx, -val), axis=1)
        best_idx[q0:q0 + len(block)] = np.take_along_axis(idx, order, 1)
        best_val[q0:q0 + len(block)] = np.take_along_axis(val, order, 1).astype(np.float32)
    return best_idx, best_val
