"""research.retrieval_paired: nDCG@10 per query as `disan eval --retrieval` averages it, and the
paired statistics on the same queries."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytrec_eval")

from disan.eval.retrieval import RetrievalSet, metrics, run_of, top_k, unit_rows  # noqa: E402
from research.retrieval_paired import compare, paired, per_query_ndcg  # noqa: E402

DOCS = ["d0", "d1", "d2", "d3", "d4", "d5"]


def dataset() -> RetrievalSet:
    queries = [f"q{i}" for i in range(6)]
    qrels = {q: {DOCS[i]: 1, DOCS[(i + 1) % 6]: 1} for i, q in enumerate(queries)}
    return RetrievalSet(name="toy", folder=Path("toy"), files={}, doc_ids=DOCS,
                        docs=[f"doc {d}" for d in DOCS], query_ids=queries,
                        queries=[f"query {q}" for q in queries], qrels=qrels)


def encoder(noise: float) -> Callable[[list[str]], np.ndarray]:
    """A query's vector points at its first judged document, blurred by `noise` (fixed per text)."""
    def encode(texts: list[str]) -> np.ndarray:
        rows = []
        for t in texts:
            i = int(t.split()[-1][1:])
            rng = np.random.default_rng(sum(map(ord, t)))
            rows.append(np.eye(6)[i] + noise * rng.normal(size=6))
        return np.array(rows, np.float32)
    return encode


def test_the_per_query_scores_average_to_disan_evals_ndcg() -> None:
    data = dataset()
    encode = encoder(0.8)
    per_query = per_query_ndcg(data, encode)
    idx, scores = top_k(unit_rows(encode(data.queries)), unit_rows(encode(data.docs)))
    assert len(per_query) == 6 and 0 < per_query.mean() < 1
    assert per_query.mean() == pytest.approx(metrics(data.qrels, run_of(data, idx, scores))["ndcg@10"])


def test_paired_reads_the_differences_on_the_same_queries() -> None:
    same = paired(np.array([0.2, 0.5, 0.9]), np.array([0.2, 0.5, 0.9]))
    assert same["difference"] == 0.0 and same["p"] == 1.0 and same["better"] == same["worse"] == 0
    ref = np.linspace(0, 0.5, 40)
    up = paired(ref, ref + 0.1 + 0.01 * np.sin(np.arange(40)))  # better on every query
    assert up["difference"] == pytest.approx(0.1, abs=0.01) and up["better"] == 40
    assert up["p"] < 0.001 and up["interval"][0] > 0
    mixed = paired(ref, ref + np.where(np.arange(40) % 2, 0.1, -0.1))  # as many up as down
    assert mixed["p"] > 0.5 and mixed["interval"][0] < 0 < mixed["interval"][1]


def test_compare_sets_each_candidate_against_the_reference() -> None:
    report = compare([dataset()], {"clean": encoder(0.0), "blurred": encoder(2.0)}, "clean")
    assert list(report["toy"]) == ["blurred"]
    clean = per_query_ndcg(dataset(), encoder(0.0)).mean()
    assert report["toy"]["blurred"]["reference"] == pytest.approx(clean, abs=1e-4)
    assert report["toy"]["blurred"]["difference"] < 0
