"""How a long document's window vectors are best pooled for retrieval: the first window's weight
(`lead`) and whether windows are normalised before the mean, on BEIR-layout sets.

    python -m research.window_pooling ../shared/data/retrieval/scifact ../shared/data/retrieval/cranfield \
        --bundle models/default --leads 1 1.5 2 3 4

Every document's windows run through `disan.Encoder` once (queries as served); each pooling is
then scored from the same window vectors with `disan.eval.retrieval`'s metrics (pytrec_eval).
`--overlap` cuts the windows with that many shared tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from disan.eval.retrieval import load_set, metrics, run_of, top_k, unit_rows
from disan.runtime.encoder import Encoder
from disan.text.prepare import pool


def pooled_scores(encoder: Encoder, folder: Path, leads: list[float]) -> dict:
    """{"raw"|"unit": {lead: metrics}} of one set, documents pooled each way."""
    dataset = load_set(folder)
    queries = encoder.encode(dataset.queries, normalize=True)
    prepared = encoder.prepare(dataset.docs)
    rows = encoder.embed_rows(prepared.rows)
    out: dict = {"windows": len(rows), "docs": len(dataset.docs)}
    for name, vectors in (("raw", rows), ("unit", unit_rows(rows))):
        out[name] = {}
        for lead in leads:
            docs = pool(prepared.items or [], vectors, lead)
            idx, scores = top_k(queries, unit_rows(docs))
            out[name][str(lead)] = {k: round(v, 4) for k, v in
                                    metrics(dataset.qrels, run_of(dataset, idx, scores)).items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--leads", nargs="+", type=float, default=[1.0, 1.5, 2.0, 3.0, 4.0])
    parser.add_argument("--overlap", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    encoder = Encoder(args.bundle, overlap=args.overlap, threads=args.threads)
    report = {folder.name: pooled_scores(encoder, folder, args.leads) for folder in args.folders}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.window_pooling"))
