"""Is a retrieval gain more than the queries' luck? nDCG@10 per query (pytrec_eval, as `disan eval
--retrieval` scores it) for a reference and each candidate on the same queries, and per set the mean
difference, its 95% bootstrap interval over queries and a paired sign-flip permutation p-value.

    python -m research.retrieval_paired --bundle OLD --before R0/embed.pt --after R1/embed.pt \\
        --power 0.25 --powers 0.25 0.5 --retrieval $D/retrieval/scifact $D/retrieval/cranfield \\
        [--wordllama] --out F.json

The candidates are the bundle's vectors at each of `--powers` (research.whitening_power's read-back,
first-window weight 2 as served); the first power is the reference. `--wordllama` adds the static
baseline as a candidate.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from disan.eval.retrieval import RetrievalSet, load_set, per_query, run_of, top_k, unit_rows

Encode = Callable[[list[str]], np.ndarray]


def per_query_ndcg(dataset: RetrievalSet, encode: Encode) -> np.ndarray:
    """nDCG@10 of each judged query, in the order of `dataset.qrels` (a query with nothing found: 0)."""
    idx, scores = top_k(unit_rows(encode(dataset.queries)), unit_rows(encode(dataset.docs)))
    return np.array(per_query(dataset.qrels, run_of(dataset, idx, scores), "ndcg@10"))


def paired(reference: np.ndarray, candidate: np.ndarray, rounds: int = 10_000, seed: int = 0) -> dict:
    """Mean difference (candidate - reference), its 95% bootstrap interval over queries, and the
    two-sided p-value of a sign-flip permutation test on the per-query differences."""
    diff = candidate - reference
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (rounds, len(diff)))].mean(1)
    flipped = np.abs((diff * rng.choice([-1.0, 1.0], (rounds, len(diff)))).mean(1))
    p = (1 + np.sum(flipped >= abs(diff.mean()) - 1e-12)) / (rounds + 1)
    return {"reference": round(float(reference.mean()), 4), "candidate": round(float(candidate.mean()), 4),
            "difference": round(float(diff.mean()), 4),
            "interval": [round(float(np.quantile(means, q)), 4) for q in (0.025, 0.975)],
            "p": round(float(p), 4), "queries": len(diff), "better": int(np.sum(diff > 0)),
            "worse": int(np.sum(diff < 0))}


def compare(sets: Sequence[RetrievalSet], encoders: dict[str, Encode], reference: str) -> dict:
    """{set: {candidate: paired(...) against `reference`}} for every other encoder."""
    report: dict = {}
    for dataset in sets:
        scores = {name: per_query_ndcg(dataset, encode) for name, encode in encoders.items()}
        report[dataset.name] = {name: paired(scores[reference], s)
                                for name, s in scores.items() if name != reference}
    return report


def main(argv: list[str] | None = None) -> int:
    # torch checkpoints and onnxruntime: only the command needs them, not the statistics
    from disan.eval.encoders import wordllama_encoder
    from research.whitening_power import add_read_back_arguments, label, power_encoders

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_read_back_arguments(parser, "the first is the reference", required=True)
    parser.add_argument("--retrieval", type=Path, nargs="+", required=True, help="BEIR-layout folders")
    parser.add_argument("--wordllama", action="store_true", help="WordLlama 256-d as a candidate too")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    encoders = power_encoders(args.bundle, args.before, args.after, args.power, args.powers, args.threads)
    if args.wordllama:
        encoders["WordLlama 256-d"] = wordllama_encoder()
    report = compare([load_set(f) for f in args.retrieval], encoders, label(args.powers[0]))
    args.out.write_text(json.dumps({"reference": label(args.powers[0]), "sets": report}, indent=1) + "\n",
                        encoding="utf-8")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.retrieval_paired"))
