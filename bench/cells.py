"""How big should one onnxruntime call be? Encoder throughput vs the padded-cell budget (one run).

    python -m bench.cells --bundle models/default --data ../shared/data [--threads 2]

DiSAN's token2token attention materialises [B, n, n, d] tensors, so a call's working set grows
with batch x n^2 ("padded cells", what `max_batch_cells` bounds). Once that no longer fits in the
CPU caches, bigger batches get slower per sentence. For each budget this measures ORT fp32
sentences/s on real sentences, two ways:
- "sorted": a whole length bucket, length-sorted, cut by the budget (the offline best case);
- "windows of 64": random arrival order, 64 sentences at a time sorted and cut by the budget,
  which is what the service's batcher does at concurrency 64 with max_batch_size 64.
The service default (`max_batch_cells`) is chosen from this table (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bench.offline import load_sentences
from bench.report import run_and_report
from disan.runtime.batching import split_by_cells
from disan.runtime.runtime import load_offline

BUDGETS = [1024, 2048, 4096, 8192, 16384, 65536, 262144]


def run_parts(embed, rows: list[list[int]], budget: int, window: int) -> int:
    """Encode `rows` in arrival windows of `window`, each sorted and cut by `budget`; -> calls."""
    calls = 0
    for start in range(0, len(rows), window):
        chunk = sorted(rows[start : start + window], key=len)
        for part in split_by_cells([len(r) for r in chunk], budget, window):
            embed([chunk[i] for i in part])
            calls += 1
    return calls


def measure(embed, rows: list[list[int]], budget: int, window: int, repeats: int) -> dict:
    """Best-of-`repeats` sentences/s and the number of ORT calls per pass."""
    run_parts(embed, rows[:window], budget, window)  # warm-up
    best, calls = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        calls = run_parts(embed, rows, budget, window)
        best = min(best, time.perf_counter() - t)
    return {"sentences_per_s": round(len(rows) / best, 1), "calls": calls}


def run_cells(args: argparse.Namespace) -> dict:
    """Every budget x (bucket sorted, SNLI-length windows of 64)."""

    rt = load_offline(args.bundle, threads=args.threads)
    buckets = load_sentences(args.data, args.per_bucket)
    as_rows = {name: [rt.text_ids(s) for s in sents]
               for name, sents in buckets.items() if sents}
    rng = np.random.default_rng(0)
    snli = list(as_rows["11-25"])
    rng.shuffle(snli)
    cases = {f"{name} sorted": (rows, len(rows)) for name, rows in as_rows.items()}
    cases["11-25 windows of 64"] = (snli, 64)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "threads": args.threads, "cases": {}}
    for case, (rows, window) in cases.items():
        results["cases"][case] = {}
        for budget in args.budgets:
            stats = measure(rt.embed, rows, budget, window, args.repeats)
            results["cases"][case][str(budget)] = stats
            print(f"{case:>22} cells {budget:>7}: {stats['sentences_per_s']:8.1f} sent/s "
                  f"({stats['calls']} calls)", flush=True)
    return results


def markdown(results: dict) -> str:
    """Case x budget table of sentences/s, best budget of each case in bold."""
    budgets = list(next(iter(results["cases"].values())))
    lines = ["| case | " + " | ".join(f"{b} cells" for b in budgets) + " |",
             "|---" * (len(budgets) + 1) + "|"]
    for case, row in results["cases"].items():
        best = max(row.values(), key=lambda s: s["sentences_per_s"])["sentences_per_s"]
        cells = [f"**{s['sentences_per_s']:.0f}**" if s["sentences_per_s"] == best
                 else f"{s['sentences_per_s']:.0f}" for s in row.values()]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-bucket", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", type=int, nargs="+", default=BUDGETS)
    parser.add_argument("--json", type=Path, default=Path("bench/results/cells.json"))
    return run_and_report(parser, run_cells, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
