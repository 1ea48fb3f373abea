"""Is an STS difference more than the pairs' luck? The cosine Spearman of a reference and each
candidate on the same staged STS pairs (as `disan eval --sts` scores them: STS other as the mean over
its subsets), with the difference's 95% interval and two-sided p from a paired bootstrap over the
pairs (resampled within each subset).

    python -m research.sts_paired --bundle OLD --before R0/embed.pt --after R1/embed.pt \\
        --power 0.25 --powers 0.25 0.5 --data $D --out F.json

The candidates are the bundle's vectors at each of `--powers` (research.whitening_power's read-back);
the first power is the reference.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from disan.data.sts import STS_SETS, SUBSET_FIELDS, pair_cosines, read_pairs, subsets_of

Encode = Callable[[list[str]], np.ndarray]


def cosines(encode: Encode, left: list[str], right: list[str]) -> np.ndarray:
    """Each pair's cosine, both sides embedded in one call (as `disan eval --sts` embeds them)."""
    vecs = np.asarray(encode(left + right), dtype=np.float64)
    return pair_cosines(vecs[: len(left)], vecs[len(left):])


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of x [R, n] with the same row of y (ties averaged)."""
    rx, ry = (np.apply_along_axis(rankdata, 1, a) for a in (x, y))
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    return (rx * ry).sum(1) / np.sqrt((rx ** 2).sum(1) * (ry ** 2).sum(1))


def paired_bootstrap(gold: np.ndarray, reference: np.ndarray, candidate: np.ndarray, groups: np.ndarray,
                     rounds: int = 2000, seed: int = 0) -> dict:
    """The set's score (mean over `groups` of each group's Spearman) for both, the difference, its
    95% bootstrap interval and two-sided p (pairs resampled within each group, the same draw for both)."""
    rng = np.random.default_rng(seed)
    ref_runs, cand_runs, ref_score, cand_score = [], [], [], []
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        ref_score.append(spearman(reference[rows][None], gold[rows][None])[0])
        cand_score.append(spearman(candidate[rows][None], gold[rows][None])[0])
        draw = rows[rng.integers(0, len(rows), (rounds, len(rows)))]
        ref_runs.append(spearman(reference[draw], gold[draw]))
        cand_runs.append(spearman(candidate[draw], gold[draw]))
    diffs = np.mean(cand_runs, 0) - np.mean(ref_runs, 0)
    p = min(1.0, 2 * min(np.mean(diffs <= 0), np.mean(diffs >= 0)))
    ref, cand = float(np.mean(ref_score)), float(np.mean(cand_score))
    return {"reference": round(ref, 4), "candidate": round(cand, 4), "difference": round(cand - ref, 4),
            "interval": [round(float(np.quantile(diffs, q)), 4) for q in (0.025, 0.975)],
            "p": round(float(p), 4)}


def compare(data: Path, encoders: dict[str, Encode], reference: str, sets: Sequence[str] | None = None,
            rounds: int = 2000) -> dict:
    """{set: {candidate: paired_bootstrap(...) against `reference`}} on every staged STS set."""
    report: dict = {}
    for name in sets or [n for n in STS_SETS if (data / STS_SETS[n][0]).is_file()]:
        left, right, gold = read_pairs(data, name)
        groups = np.zeros(len(gold), int)
        if name in SUBSET_FIELDS:
            groups = np.unique(subsets_of(data, name), return_inverse=True)[1]
        cos = {label: cosines(encode, left, right) for label, encode in encoders.items()}
        report[name] = {label: paired_bootstrap(gold, cos[reference], c, groups, rounds)
                        for label, c in cos.items() if label != reference}
    return report


def main(argv: list[str] | None = None) -> int:
    # torch checkpoints: the command only
    from research.whitening_power import add_read_back_arguments, label, power_encoders

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_read_back_arguments(parser, "the first is the reference", required=True)
    parser.add_argument("--data", type=Path, required=True, help="the staged data")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    encoders = power_encoders(args.bundle, args.before, args.after, args.power, args.powers, args.threads)
    report = compare(args.data, encoders, label(args.powers[0]), rounds=args.rounds)
    out = {"reference": label(args.powers[0]), "rounds": args.rounds, "sets": report}
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.sts_paired"))
