"""Is a candidate below a reference on a transfer task, or on its items' luck? The same protocol as
`disan eval --transfer` (disan.eval.transfer: standardised features, logistic regression solved to its
optimum, C = 1), scored item by item so the two encoders are compared on the same items:

- TREC and SICK-E (one fixed test split of 500 items each, 0.2 points an item): the accuracy of each,
  the items only one of them gets right, and the exact McNemar p-value on those items (two-sided).
- MR, CR, SUBJ, MPQA (10-fold cross-validation): the accuracy at each fold seed, so the difference
  is read against how much the folds alone move it; the folds depend on the labels and the seed
  only, so both encoders meet the same folds at a seed.

    python -m research.transfer_paired --reference OLD_BUNDLE --bundle NEW_BUNDLE --data $D \\
        [--seeds 1 2 3] [--before R0/embed.pt --after R1/embed.pt --power 0.25 --powers 0.5] --out F.json

With `--before/--after` (research.whitening_power's read-back), the candidates are `--bundle`'s
vectors whitened at each of `--powers` instead of the bundle as served (`--bundle` is then the bundle
before the whitening).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import binomtest
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from disan.data.readers import read_jsonl
from disan.eval.transfer import CLASSIFICATION, classifier
from disan.runtime.encoder import Encoder

Encode = Callable[[list[str]], np.ndarray]


def item_scores(encode: Encode, senteval: Path, seeds: Sequence[int]) -> dict:
    """{task: {"right": [bool per item]} for TREC and SICK-E, {"right": {seed: [bool per item]}}
    for the cross-validated tasks}: whether each item was classified right."""
    out: dict = {}
    for name, rel in CLASSIFICATION.items():
        rows = read_jsonl(senteval / rel)
        x, y = encode([r["text"] for r in rows]), np.array([r["label"] for r in rows])
        out[name] = {"right": {}}
        for seed in seeds:
            folds = StratifiedKFold(n_splits=10, shuffle=True, random_state=seed)
            out[name]["right"][seed] = cross_val_predict(classifier("fixed", seed), x, y, cv=folds) == y
    train, test = (read_jsonl(senteval / f"TREC/trec_{split}.jsonl.gz") for split in ("train", "test"))
    clf = classifier().fit(encode([r["text"] for r in train]), [r["label"] for r in train])
    labels = np.array([r["label"] for r in test])
    out["TREC"] = {"right": clf.predict(encode([r["text"] for r in test])) == labels}
    pairs = {s: read_jsonl(senteval / f"SICK/sick_{s}.jsonl.gz") for s in ("train", "dev")}
    feats = {}
    for split, rows in pairs.items():
        u, v = encode([r["sentence_a"] for r in rows]), encode([r["sentence_b"] for r in rows])
        feats[split] = np.hstack([u, v, np.abs(u - v), u * v])
    clf = classifier().fit(feats["train"], [r["entailment"] for r in pairs["train"]])
    out["SICK-E"] = {"right": clf.predict(feats["dev"]) == np.array([r["entailment"] for r in pairs["dev"]])}
    return out


def mcnemar(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """Accuracies (percent), the items only one gets right, and the exact two-sided McNemar p-value."""
    only_ref = int(np.sum(reference & ~candidate))
    only_cand = int(np.sum(candidate & ~reference))
    p = binomtest(only_ref, only_ref + only_cand, 0.5).pvalue if only_ref + only_cand else 1.0
    return {"reference": round(100 * float(reference.mean()), 2),
            "candidate": round(100 * float(candidate.mean()), 2),
            "only_reference": only_ref, "only_candidate": only_cand, "p": round(float(p), 4)}


def seed_summary(seeds: dict[str, dict]) -> dict:
    """The cross-validated task's accuracies and their difference, as means over the fold seeds."""
    mean = {k: round(float(np.mean([v[k] for v in seeds.values()])), 3) for k in ("reference", "candidate")}
    diffs = [v["candidate"] - v["reference"] for v in seeds.values()]
    return {"seeds": seeds, "reference_mean": mean["reference"], "candidate_mean": mean["candidate"],
            "difference_mean": round(float(np.mean(diffs)), 3),
            "difference_range": [round(min(diffs), 2), round(max(diffs), 2)]}


def compare(reference: dict, candidate: dict) -> dict:
    """Per task: McNemar on the fixed splits; on the cross-validated tasks McNemar at each seed (the
    same folds for both) and the means over the seeds."""
    report: dict = {}
    for task, ref in reference.items():
        cand = candidate[task]["right"]
        if isinstance(ref["right"], dict):
            report[task] = seed_summary({str(s): mcnemar(ref["right"][s], cand[s]) for s in ref["right"]})
        else:
            report[task] = mcnemar(ref["right"], cand)
    return report


def candidates(args: argparse.Namespace) -> dict[str, Encode]:
    """Label -> encoder: the bundle as served, or its vectors whitened at each of --powers."""
    if args.before is None:
        return {str(args.bundle): Encoder(args.bundle, threads=args.threads).encode}
    from research.whitening_power import power_encoders  # torch checkpoints: only the read-back needs them

    return power_encoders(args.bundle, args.before, args.after, args.power, args.powers, args.threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="the bundle whose scores are the floor")
    parser.add_argument("--bundle", type=Path, required=True, help="the candidate bundle (or the one before "
                        "the whitening, with --before/--after)")
    parser.add_argument("--data", type=Path, required=True, help="the staged data (its senteval/)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                        help="fold seeds (1: disan eval's)")
    parser.add_argument("--before", type=Path, default=None, help="research.whitening_power's --before")
    parser.add_argument("--after", type=Path, default=None, help="research.whitening_power's --after")
    parser.add_argument("--power", type=float, default=0.25, help="the power --after was whitened at")
    parser.add_argument("--powers", type=float, nargs="+", default=[0.25])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if (args.before is None) != (args.after is None):
        parser.error("--before and --after go together")
    senteval = args.data / "senteval"
    reference = item_scores(Encoder(args.reference, threads=args.threads).encode, senteval, args.seeds)
    report = {"reference": str(args.reference), "seeds": args.seeds, "candidates": {}}
    for name, encode in candidates(args).items():
        report["candidates"][name] = compare(reference, item_scores(encode, senteval, args.seeds))
        print(name, json.dumps({t: {k: v for k, v in r.items() if k != "seeds"}
                                for t, r in report["candidates"][name].items()}))
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.transfer_paired"))
