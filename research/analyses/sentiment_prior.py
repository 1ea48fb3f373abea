"""Would a per-class bias tuned on dev raise a sentiment model's accuracy as served? Measured on
dev alone, by halves: tune on one random half, score the other, many times.

A model's neutral recall fell as its dev accuracy rose (docs/experiments.md), so shifting its
class priors is the cheapest fix to try: a bias b added to the log-probabilities could be folded
into the output layer's bias without changing the graph. Tuned and scored on the same 1,101
sentences it can only gain, which proves nothing; the held-out halves say whether it carries to
sentences it was not tuned on. The test set is not read.

    python -m research.analyses.sentiment_prior CKPT... --bundle models/default \
        --data ../shared/data/sst/sst5_dev.jsonl.gz [--splits 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from research.analyses.sentiment_served import labelled, probabilities, read_bundle, served_model

GRID = np.round(np.arange(-1.0, 1.0001, 0.05), 2)


def tune_bias(logp: np.ndarray, labels: np.ndarray, sweeps: int = 3) -> np.ndarray:
    """[C] bias (class 0's fixed at 0) maximising the accuracy of argmax(logp + b), by coordinate
    ascent over GRID; the smaller |b_c| on a tie, so a bias that buys nothing stays 0."""
    bias = np.zeros(logp.shape[1])

    def accuracy(c: int, g: float) -> float:  # with bias[c] set to g
        trial = bias.copy()
        trial[c] = g
        return float(((logp + trial).argmax(-1) == labels).mean())

    for _ in range(sweeps):
        for c in range(1, logp.shape[1]):
            bias[c] = max(GRID, key=lambda g: (accuracy(c, g), -abs(g)))  # noqa: B023 (used at once)
    return bias


def held_out_gains(logp: np.ndarray, labels: np.ndarray, splits: int, seed: int = 0) -> np.ndarray:
    """[splits] accuracy points gained on one half by the bias tuned on the other half."""
    rng, half, gains = np.random.default_rng(seed), len(labels) // 2, []
    for _ in range(splits):
        perm = rng.permutation(len(labels))
        fit, held = perm[:half], perm[half:]
        bias = tune_bias(logp[fit], labels[fit])
        with_bias = ((logp[held] + bias).argmax(-1) == labels[held]).mean()
        gains.append(100 * (with_bias - (logp[held].argmax(-1) == labels[held]).mean()))
    return np.asarray(gains)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", type=Path, nargs="+", help="sentiment checkpoints (borrowed or not)")
    ap.add_argument("--bundle", type=Path, default=Path("models/default"))
    ap.add_argument("--data", type=Path, required=True, help="the dev JSONL(.gz) of {text, label}")
    ap.add_argument("--splits", type=int, default=40)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.splits < 1:
        ap.error(f"--splits {args.splits}: give at least 1")
    torch.set_num_threads(1)
    try:
        weights, vocab = read_bundle(args.bundle)
        texts, labels = labelled(args.data)
        runs = []
        for checkpoint in args.checkpoints:
            model = served_model(checkpoint, weights)
            logp = np.log(np.clip(probabilities(model, vocab, texts), 1e-9, None))
            gains = held_out_gains(logp, labels, args.splits)
            dev = round(100 * float((logp.argmax(-1) == labels).mean()), 2)
            row = {"checkpoint": str(checkpoint), "dev": dev,
                   "held_out_gain_mean": round(float(gains.mean()), 2),
                   "held_out_gain_sd": round(float(gains.std()), 2),
                   "positive_share": round(float((gains > 0).mean()), 3)}
            print("  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
            runs.append(row)
    except (OSError, ValueError) as exc:  # a missing file, a checkpoint of another task: one line
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    if args.json:
        args.json.write_text(json.dumps({"data": args.data.name, "n": len(labels), "splits": args.splits,
                                         "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.sentiment_prior"))
