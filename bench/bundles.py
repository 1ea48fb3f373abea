"""A/B of bundles: offline ORT throughput of two or more bundles, alternating, in one process.

    python -m bench.bundles --bundles OLD NEW --threads 1 2 [--buckets 11-25 51-100] \
        [--graphs embed sentiment nli_embed] [--json OUT]

For each model (`embed`: the encoder behind /embed; `sentiment`: the /sentiment model;
`nli_embed`: the NLI model's sentence encoder, run once per side of a /nli pair), ORT
thread count and length bucket, every bundle's model runs the same real
sentences (bench.offline's buckets, batches cut like the service's batcher) in alternating
passes; the best pass of each counts. Ratios are to the first bundle. Used to decide whether
the shipped graphs compute the attention in query-row chunks (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from bench.offline import load_sentences, ort_encoder, throughput
from bench.report import run_and_report
from disan.runtime.runtime import load_offline


def run_ab(args: argparse.Namespace) -> dict:
    """Best-of sentences/s of every bundle per (model, threads, bucket), measured alternately."""

    sentences = load_sentences(args.data, args.per_bucket)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "bundles": [str(b) for b in args.bundles],
                     "rows": []}
    for graph, threads in itertools.product(args.graphs, args.threads):
        models = [ort_encoder(load_offline(b, threads=threads), graph) for b in args.bundles]
        for bucket in args.buckets:
            best = [0.0] * len(models)
            for _ in range(args.rounds):
                for i, run in enumerate(models):
                    best[i] = max(best[i], throughput(run, sentences[bucket], 64, 2, 4096))
            row = {"graph": graph, "threads": threads, "bucket": bucket,
                   "sentences_per_s": [round(b) for b in best],
                   "ratio_to_first": [round(b / best[0], 3) for b in best]}
            results["rows"].append(row)
            print(row, flush=True)
    return results


def markdown(results: dict) -> str:
    """One row per (threads, bucket): sentences/s of each bundle and the ratio to the first."""
    names = [Path(b).name for b in results["bundles"]]
    lines = ["| model | ORT threads | bucket | " + " | ".join(f"{n} sent/s" for n in names) + " | ratios |",
             "|---|---|---|" + "---|" * (len(names) + 1)]
    for r in results["rows"]:
        lines.append(f"| {r.get('graph', 'embed')} | {r['threads']} | {r['bucket']} | "
                     + " | ".join(map(str, r["sentences_per_s"]))
                     + " | " + " / ".join(f"{x:.2f}" for x in r["ratio_to_first"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=Path, nargs="+", required=True)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--buckets", nargs="+", default=["11-25", "51-100"])
    parser.add_argument("--graphs", nargs="+", choices=["embed", "sentiment", "nli_embed"], default=["embed"],
                        help="which models to time: /embed's encoder, the /sentiment model, /nli's encoder")
    parser.add_argument("--per-bucket", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (2 passes each)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/bundles.json"))
    return run_and_report(parser, run_ab, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
