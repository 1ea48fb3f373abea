"""Would an ensemble of sentiment models beat the first alone? (docs/experiments.md)

Every subset of the first model and its members (`disan ensemble`'s inputs: sentiment checkpoints
over one word table), scored as the ensemble would serve it: the mean of the members'
probabilities. The texts are read with the bundle's vocabulary (spelling, hashed unknown words),
and each member reads the first model's word vectors, so the first model alone scores what the
bundle serves (before its int8 table rounding).

    python -m research.analyses.sentiment_ensembles FIRST MEMBER... \
        --data ../shared/data/sst/sst5_dev.jsonl.gz \
        [--vocab models/default/vocab.json] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from disan.data.readers import read_jsonl
from disan.text.tokenizer import Vocab
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint
from research.ensemble import join

BATCH = 128


def member_probabilities(first: Path, members: list[Path], vocab: Vocab, texts: list[str]) -> np.ndarray:
    """[K, N, C]: each model's class probabilities of `texts` (the first model first)."""
    model = model_from_checkpoint(join(load_checkpoint(first), [load_checkpoint(p) for p in members],
                                       [str(p) for p in members]))[0].eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), BATCH):
            enc = vocab.encode(texts[i:i + BATCH])
            logits = model.member_logits(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask))
            out.append(torch.softmax(torch.stack(logits), dim=-1))
    return torch.cat(out, dim=1).numpy()


def subsets(probs: np.ndarray, labels: np.ndarray) -> list[dict]:
    """Accuracy (%) of every non-empty subset of the models, by the mean of their probabilities."""
    rows = []
    for size in range(1, probs.shape[0] + 1):
        for combo in itertools.combinations(range(probs.shape[0]), size):
            hit = probs[list(combo)].mean(axis=0).argmax(axis=-1) == labels
            rows.append({"models": list(combo), "accuracy": round(100 * float(hit.mean()), 2)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("members", type=Path, nargs="+")
    ap.add_argument("--data", type=Path, required=True, help="a JSONL(.gz) file of {text, label}")
    ap.add_argument("--vocab", type=Path, default=Path("models/default/vocab.json"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = read_jsonl(args.data)
    texts, labels = [r["text"] for r in rows], np.array([int(r["label"]) for r in rows])
    probs = member_probabilities(args.first, args.members, Vocab.load(args.vocab), texts)
    entropy = -(probs * np.log(probs + 1e-12)).sum(-1).mean(-1)
    report = {"data": args.data.name, "n": len(texts),
              "models": [str(p) for p in [args.first, *args.members]],
              "mean_entropy": [round(float(e), 3) for e in entropy], "subsets": subsets(probs, labels)}
    for row in report["subsets"]:
        print(f"{'+'.join(map(str, row['models'])):>10}  {row['accuracy']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.sentiment_ensembles"))
