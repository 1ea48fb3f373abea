"""Where the frozen vectors lose TREC: accuracy per question type (docs/results.md).

`disan eval --transfer` reports one TREC accuracy. This fits the same probe (`disan.eval.transfer`'s
logistic regression on trec_train, `--protocol fixed` or `tuned` as there) for each encoder and
splits its trec_test accuracy by the six coarse types, with the questions a baseline gets right
and DiSAN wrong.

    python -m research.analyses.trec_classes --bundle models/default --data ../shared/data \
        --baselines minilm,mpnet
    python -m research.analyses.trec_classes --checkpoint runs/x/best.pt --baselines ''
        # (a student before export)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench.report import run_and_report
from disan.data.readers import read_jsonl
from disan.eval import transfer
from disan.eval.transfer import PROTOCOLS, add_baselines, checkpoint_encoder, classifier, disan_encoder

EXAMPLES = 12  # questions listed per baseline that DiSAN gets wrong and it gets right


def run(args: argparse.Namespace) -> dict:
    encoders = {"disan": (lambda: checkpoint_encoder(args.checkpoint)) if args.checkpoint
                else (lambda: disan_encoder(args.bundle))}
    named = {key: (key, make) for key, (_label, make) in transfer.BASELINES.items()}  # short column names
    add_baselines(encoders, args.baselines, named, "--baselines")  # a wrong name fails first
    senteval = args.data / "senteval" / "TREC"
    train, test = (read_jsonl(senteval / f"trec_{split}.jsonl.gz") for split in ("train", "test"))
    gold = np.array([r["label"] for r in test])
    predicted = {}
    for name, make in encoders.items():
        encode = make()
        probe = classifier(args.protocol).fit(encode([r["text"] for r in train]), [r["label"] for r in train])
        predicted[name] = probe.predict(encode([r["text"] for r in test]))
        print(name, f"{100 * float((predicted[name] == gold).mean()):.2f}", flush=True)
    types = sorted(set(gold))
    per_type = {t: {"questions": int((gold == t).sum()),
                    **{n: round(100 * float((p[gold == t] == t).mean()), 2) for n, p in predicted.items()}}
                for t in types}
    lost = {}
    for name in predicted:
        if name == "disan":
            continue
        wrong = np.flatnonzero((predicted["disan"] != gold) & (predicted[name] == gold))
        lost[name] = {"count": int(len(wrong)),
                      "examples": [{"text": test[i]["text"], "gold": str(gold[i]),
                                    "disan": str(predicted["disan"][i])} for i in wrong[:EXAMPLES]]}
    source = {"checkpoint": str(args.checkpoint)} if args.checkpoint else {"bundle": str(args.bundle)}
    return {**source, "protocol": args.protocol,
            "accuracy": {n: round(100 * float((p == gold).mean()), 2) for n, p in predicted.items()},
            "per_type": per_type, "disan_wrong_baseline_right": lost}


def markdown(results: dict) -> str:
    names = list(results["accuracy"])
    lines = ["| question type | questions | " + " | ".join(names) + " |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
    lines += [f"| {t} | {row['questions']} | " + " | ".join(f"{row[n]:.2f}" for n in names) + " |"
              for t, row in results["per_type"].items()]
    total = sum(row["questions"] for row in results["per_type"].values())
    lines.append(f"| all | {total} | " + " | ".join(f"{results['accuracy'][n]:.2f}" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="score this student checkpoint (before export, in torch) instead of --bundle")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--baselines", default="minilm", help="comma-separated: glove, minilm, mpnet")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="fixed")
    parser.add_argument("--json", type=Path, default=Path("research/analyses/results/trec_classes.json"))
    return run_and_report(parser, run, markdown, argv)


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.trec_classes"))
