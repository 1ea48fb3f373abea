"""research.analyses.rerank_hybrid: each query's dense candidates reranked by POST /rerank; w = 0
is the dense ranking's metrics, w = 1 orders the candidates by their sparse vectors alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import research.analyses.rerank_hybrid as module
from disan import Encoder
from disan.eval.encoders import disan_encoder
from disan.eval.retrieval import load_set, metrics, run_of, top_k
from research.analyses.rerank_hybrid import evaluate, main

DOCS = [{"_id": "d1", "title": "dog", "text": "a dog is running in the park"},
        {"_id": "d2", "title": "", "text": "the woman is reading a book at the table"},
        {"_id": "d3", "title": "guitar", "text": "a man is playing the guitar in the street"},
        {"_id": "d4", "title": "film", "text": "a boring movie with a terrible plot"}]
QUERIES = [{"_id": "q1", "text": "dog running"}, {"_id": "q2", "text": "man playing guitar"}]
QRELS = [("q1", "d1", 1), ("q2", "d3", 2), ("q2", "d1", 1)]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    pytest.importorskip("pytrec_eval", reason="pytrec_eval is not installed (pip install '.[eval]')")
    root = tmp_path / "set"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (root / "qrels" / "test.tsv").write_text("".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS))
    return root


def test_w0_is_the_dense_ranking_and_w1_the_sparse_one(folder, sparse_bundle, monkeypatch):
    dataset = load_set(folder)
    encode = disan_encoder(sparse_bundle)
    idx, scores = top_k(encode(dataset.queries), encode(dataset.docs), 3)
    dense = metrics(dataset.qrels, run_of(dataset, idx, scores))
    report = evaluate([folder], sparse_bundle, [0.0, 1.0], candidates=3)["set"]
    assert report["0.0"]["ndcg@10"] == pytest.approx(dense["ndcg@10"])
    assert report["0.0"]["mrr@10"] == pytest.approx(dense["mrr@10"])

    # w = 1: the candidates by the dot product of their sparse vectors, checked on the Encoder's
    seen = []
    real = module.metrics
    monkeypatch.setattr(module, "metrics", lambda qrels, run: seen.append(run) or real(qrels, run))
    evaluate([folder], sparse_bundle, [1.0], candidates=3)
    encoder = Encoder(sparse_bundle, variant="fp32")
    for (qid, query), row in zip(zip(dataset.query_ids, dataset.queries, strict=True), idx, strict=True):
        (qi, qv) = encoder.encode_sparse([query])[0]
        docs = encoder.encode_sparse([dataset.docs[j] for j in row])
        dots = [float(np.dot(qv[np.isin(qi, di)], dv[np.isin(di, qi)])) for di, dv in docs]
        want = [dataset.doc_ids[row[i]] for i in np.argsort(-np.array(dots), kind="stable")]
        got = sorted(seen[0][qid], key=lambda d: -seen[0][qid][d])
        assert got == want


def test_main_writes_the_report(folder, sparse_bundle, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main([str(folder), "--bundle", str(sparse_bundle), "--hybrid", "0.5", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["set"]["0.5"]) == {"ndcg@10", "mrr@10", "recall@100"}
    assert "w=0.5" in capsys.readouterr().out
