"""Which sentiment checkpoint would a bundle serve best? Each scored as the bundle would serve it.

To choose among runs on dev as served before exporting one (docs/experiments.md, "six seeds of
MPNet's vectors with the average"): the texts are read with the bundle's vocabulary (spelling,
compound pieces, hashed unknown words), and each checkpoint is rounded as the bundle stores its
sentiment model, from the manifest's `weights`: its own table in `embedding_storage.sentiment`,
a borrowed copy of the encoder's table (`disan borrow-words`) in `embedding_storage.embed`, every
other parameter in `matrix_storage.sentiment` (`model_export.embed.task_model_as_stored`). A
checkpoint exported into such a bundle scores here what the bundle serves, in PyTorch.
`--subsets` also scores every subset of the checkpoints by the mean of their probabilities as
served (an ensemble of models that each keep their own table); `--probs OUT.npz` keeps the
probabilities (`FILE/K`: checkpoint K's [N, C] on FILE, `FILE/labels`) for analyses of them.

    python -m research.analyses.sentiment_served CKPT... --bundle models/default \
        --data ../shared/data/sst/sst5_dev.jsonl.gz [--data ...test.jsonl.gz] [--subsets] \
        [--json OUT] [--probs OUT.npz]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from disan.bundle.manifest import load_manifest
from disan.data.readers import read_jsonl
from disan.text.tokenizer import Vocab
from disan.train.checkpoint import load_checkpoint
from model_export.calibrate import stored_task_model
from research.analyses.sentiment_ensembles import subsets

BATCH = 128
TASK = "sentiment"


def served_model(checkpoint: Path, weights: dict):
    """The sentiment model of `checkpoint`, rounded as a bundle whose manifest's `weights` are
    `weights` stores its sentiment model."""
    model = stored_task_model(load_checkpoint(checkpoint), weights, str(checkpoint))
    if model.cfg.task != TASK:
        raise ValueError(f"{checkpoint}: a sentiment checkpoint, not task '{model.cfg.task}'")
    return model


def probabilities(model, vocab: Vocab, texts: list[str]) -> np.ndarray:
    """[N, C]: the model's class probabilities of `texts`, read with `vocab`."""
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), BATCH):
            enc = vocab.encode(texts[i:i + BATCH])
            out.append(torch.softmax(model(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)), -1))
    return torch.cat(out).numpy()


def read_bundle(bundle: Path) -> tuple[dict, Vocab]:
    """(the manifest's `weights`, the vocabulary) a bundle reads its texts and stores its models with."""
    manifest = load_manifest(bundle)
    return manifest["weights"], Vocab.load(bundle / manifest["vocab"])


def labelled(path: Path) -> tuple[list[str], np.ndarray]:
    """(texts, integer labels) of a JSONL(.gz) file of {text, label}."""
    rows = read_jsonl(path)
    return [r["text"] for r in rows], np.array([int(r["label"]) for r in rows])


def score(checkpoints: list[Path], bundle: Path, data: list[Path], with_subsets: bool = False,
          probs_out: Path | None = None) -> dict:
    """{bundle, n: {file: size}, runs: [{checkpoint, file: accuracy %...}]}, each run printed; with
    `with_subsets` also subsets: {file: [{models: [index...], accuracy}]} by mean probability;
    with `probs_out` the probabilities saved there (see the module docstring)."""
    weights, vocab = read_bundle(bundle)
    sets = {path.name: labelled(path) for path in data}
    runs, probs = [], {name: [] for name in sets}
    for checkpoint in checkpoints:
        model = served_model(checkpoint, weights)
        row = {"checkpoint": str(checkpoint)}
        for name, (texts, labels) in sets.items():
            probs[name].append(probabilities(model, vocab, texts))
            row[name] = round(100 * float((probs[name][-1].argmax(-1) == labels).mean()), 2)
        print("  ".join(f"{v}" for v in row.values()), flush=True)
        runs.append(row)
    sizes = {name: len(labels) for name, (_, labels) in sets.items()}
    report = {"bundle": bundle.name, "n": sizes, "runs": runs}
    if probs_out is not None:
        arrays = {f"{name}/{k}": p for name, rows in probs.items() for k, p in enumerate(rows)}
        np.savez_compressed(probs_out, **arrays, **{f"{name}/labels": y for name, (_, y) in sets.items()})
    if with_subsets:
        report["subsets"] = {name: subsets(np.stack(probs[name]), labels)
                             for name, (_, labels) in sets.items()}
        for name, rows in report["subsets"].items():
            print(name, "  ".join(f"{'+'.join(map(str, r['models']))}: {r['accuracy']}" for r in rows))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", type=Path, nargs="+", help="sentiment checkpoints (borrowed or not)")
    ap.add_argument("--bundle", type=Path, default=Path("models/default"),
                    help="the bundle whose vocabulary and storage they are read with")
    ap.add_argument("--data", type=Path, action="append", required=True,
                    help="a JSONL(.gz) file of {text, label}; repeat for more")
    ap.add_argument("--subsets", action="store_true",
                    help="also every subset of the checkpoints, by the mean of their probabilities")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--probs", type=Path, default=None, help="save the probabilities here (.npz)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        report = score(args.checkpoints, args.bundle, args.data, args.subsets, args.probs)
    except (OSError, ValueError) as exc:  # a missing file, a checkpoint of another task: one line
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.sentiment_served"))
