"""Rerank with the hybrid score, through the service: each query's dense top k, reranked by POST /rerank.

    python -m research.analyses.rerank_hybrid DIR... --bundle models/default --hybrid 0 0.3 0.5 \
        [--candidates 100] [--json OUT]

Each DIR is a set in BEIR's layout (what `disan eval --retrieval` reads). The candidates are the
bundle's dense top k of each query (`disan eval --retrieval`'s vectors and ranking). The query
and its candidates then go to `POST /rerank` of an in-process server (the shipped fast path,
default settings) with `hybrid` w; nDCG@10 and MRR@10 are computed on the reranked lists
(pytrec_eval, as `disan eval --retrieval` computes them). Recall@k is the candidates' own and does
not change with w. With w = 0, /rerank returns the dense order, so that row is the dense ranking's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from disan.eval.encoders import disan_encoder
from disan.eval.retrieval import RetrievalSet, load_set, metrics, top_k


def reranked(client, dataset: RetrievalSet, candidates, weight: float) -> dict[str, dict[str, float]]:
    """The trec run of each query's candidates as POST /rerank orders them at `weight`."""
    run = {}
    for qid, query, row in zip(dataset.query_ids, dataset.queries, candidates, strict=True):
        texts = [dataset.docs[j] for j in row]
        r = client.post("/rerank", json={"query": query, "texts": texts, "hybrid": weight})
        r.raise_for_status()
        # scores by rank, not the raw score: ties keep /rerank's order under trec_eval's tie-break
        run[qid] = {dataset.doc_ids[row[x["index"]]]: float(len(row) - rank)
                    for rank, x in enumerate(r.json())}
    return run


def wait_ready(client, timeout_s: float = 300.0) -> None:
    """Until the server has loaded and warmed up the bundle (it loads in the background)."""
    deadline = time.monotonic() + timeout_s
    while (r := client.get("/ready")).status_code != 200:
        if client.get("/health").status_code != 200 or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not become ready: {r.text}")
        time.sleep(0.05)


def evaluate(folders: list[Path], bundle: Path, weights: list[float], candidates: int) -> dict:
    # the service and its test client: only this analysis needs them (the serve extra)
    from fastapi.testclient import TestClient

    from service.main import create_app  # the serve extra, as above
    from service.settings import Settings  # the serve extra, as above

    encode = disan_encoder(bundle)
    report = {}
    with TestClient(create_app(Settings(bundle=bundle))) as client:
        wait_ready(client)
        for folder in folders:
            dataset = load_set(folder)
            idx, _ = top_k(encode(dataset.queries), encode(dataset.docs), candidates)
            report[dataset.name] = {str(w): metrics(dataset.qrels, reranked(client, dataset, idx, w))
                                    for w in weights}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--hybrid", nargs="+", type=float, default=[0.0, 0.3, 0.5])
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = evaluate(args.folders, args.bundle, args.hybrid, args.candidates)
    for name, rows in report.items():
        for w, m in rows.items():
            print(f"{name:12s} w={w:<5s} " + "  ".join(f"{k} {v:.4f}" for k, v in m.items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.rerank_hybrid"))
