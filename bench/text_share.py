"""How much of the offline encoder's time per sentence is reading text, for one or more bundles.

    python -m bench.text_share --bundles models/default OTHER --data ../shared/data [--lengths 11-25]

Every bundle is loaded in one process (`load_offline`, 2 threads by default) and they take turns,
`--rounds` times: each round times, on the same real sentences of one length bucket (the offline
benchmark's), the tokenizer alone (`Runtime.text_ids`, as the offline path reads text), the embed
graph alone on those ids (the service's batch cuts), and both together. Medians of the rounds, in
sentences/s; the ratios of later bundles to the first are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.offline import BUCKETS, CPU_BATCHING, length_batches, load_sentences
from disan.runtime.runtime import load_offline

PARTS = ("text", "graph", "both")


def measure(bundles: list[Path], sentences: list[str], rounds: int, threads: int) -> dict:
    """{bundle: {part: sentences/s}} (medians) plus each later bundle's ratios to the first."""
    batches = length_batches(sentences, CPU_BATCHING.max_batch_size, CPU_BATCHING.max_batch_cells)
    runtimes = {str(b): load_offline(b, "fp32", threads=threads) for b in bundles}
    seconds: dict[str, dict[str, list[float]]] = {b: {p: [] for p in PARTS} for b in runtimes}
    for _ in range(rounds):
        for name, rt in runtimes.items():
            start = time.perf_counter()
            rows = [[rt.text_ids(t) for t in batch] for batch in batches]
            seconds[name]["text"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for ids in rows:
                rt.embed(ids)
            seconds[name]["graph"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for batch in batches:
                rt.embed([rt.text_ids(t) for t in batch])
            seconds[name]["both"].append(time.perf_counter() - start)
    rates = {name: {p: round(len(sentences) / float(np.median(s)), 1) for p, s in parts.items()}
             for name, parts in seconds.items()}
    first = str(bundles[0])
    ratios = {name: {p: round(rates[name][p] / rates[first][p], 3) for p in PARTS}
              for name in rates if name != first}
    return {"sentences": len(sentences), "rounds": rounds, "threads": threads,
            "sentences_per_s": rates, "ratio_to_first": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", type=Path, nargs="+", default=[Path("models/default")])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--lengths", default="11-25", choices=[f"{lo}-{hi}" for lo, hi in BUCKETS])
    parser.add_argument("--per-bucket", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    sentences = load_sentences(args.data, args.per_bucket)[args.lengths]
    report = {"lengths": args.lengths, **measure(args.bundles, sentences, args.rounds, args.threads)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
