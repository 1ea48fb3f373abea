"""Class offsets for an NLI or two-class sentiment model, chosen on its recipe's dev set as a bundle
would serve it (`disan calibrate`).

Why: a model's predicted class balance follows its training mix. The NLI recipe trains on
MultiNLI dev, SICK train and most of SNLI dev, and its model calls a third of SNLI's neutral pairs
entailment. Adding an offset to each class's logit corrects such a prior shift, and the offsets go
into the head's last bias (`out.linear.bias`), so the graphs and the model math stay as they are.

How: the checkpoint reads the recipe's dev set (NLI: the held-out SNLI dev slice `disan train`
selects on; SST-2: its dev file) through the bundle's vocabulary, with its tables and matrices
rounded as the bundle stores them (`model_export.embed.task_model_as_stored`). Every offset vector
on a grid (the first class fixed at 0) is scored by dev accuracy; the best wins, ties going to the
smallest total offset. The test set never takes part. At most three classes: the grid grows as
its size to the power classes - 1, and on SST-5 (five) offsets chosen on dev lowered test accuracy
for each of four models (docs/experiments.md), since dev and train share one distribution there.

    disan calibrate CKPT --bundle models/default --data ../shared/data --out CALIBRATED.pt
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from disan.bundle.manifest import load_manifest
from disan.data import readers as D
from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, RECIPES
from disan.text.tokenizer import Vocab
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint, provenance, write_checkpoint
from model_export.embed import task_model_as_stored
from model_export.graphs.storage import BORROWED

BATCH = 128
BIAS = "out.linear.bias"  # the head's last layer: logits = ... + bias
MAX_CLASSES = 3
MAX_GRID = 201  # offsets per class: the search scores MAX_GRID ** (classes - 1) vectors


def stored_task_model(payload: dict[str, Any], weights: dict, name: str = "checkpoint"):
    """The NLI or sentiment model of a checkpoint `payload`, rounded as a bundle whose manifest's
    `weights` are `weights` stores it (its own table, a borrowed copy of the encoder's, matrices)."""
    model = model_from_checkpoint(payload)[0].eval()
    task = model.cfg.task
    if task not in ("nli", "sentiment"):
        raise ValueError(f"{name}: an NLI or sentiment checkpoint, not task '{task}'")
    tables, matrices = (weights.get(field) or "fp32" for field in ("embedding_storage", "matrix_storage"))
    if model.cfg.borrowed_rows and not (isinstance(tables, dict) and "embed" in tables):
        raise ValueError(f"{name} borrows an encoder's words; the bundle has no encoder (--embed)")

    def per_model(storage: str | dict[str, str]) -> dict[str, str]:  # one for all, or one per model
        if isinstance(storage, str):
            return {t: storage for t in (task, "embed")}
        # BORROWED: the word table kept beside a piece encoder, stored in a storage of its own
        return {t: storage.get(t, "fp32") for t in (task, "embed")} | (
            {BORROWED: storage[BORROWED]} if BORROWED in storage else {})

    task_model_as_stored(model, task, per_model(tables), per_model(matrices))
    return model


def dev_set(task: str, num_classes: int, data: Path) -> tuple[str, list[D.Example], list[int]]:
    """(its name, examples, class ids) of the recipe's dev set: what selection already uses."""
    if task == "nli":
        recipe = RECIPES["nli"]
        _, examples = D.read_examples(data / recipe["holdout_from"])
        _, examples = D.holdout_split(examples, HOLDOUT_SIZE, HOLDOUT_SEED)
        name = f"{recipe['holdout_from']} (the held-out slice disan train selects on)"
    else:
        recipe = {len(RECIPES[r]["label_names"]): r for r in ("sst2", "sst5")}.get(num_classes)
        if recipe is None:
            raise ValueError(f"no recipe has a {num_classes}-class sentiment dev set (SST-2: 2, SST-5: 5)")
        name = RECIPES[recipe]["dev"]
        _, examples = D.read_examples(data / name)
    ids = D.make_dataset(task, examples, D.label_set(task, examples)).label_ids
    return name, examples, list(ids)


def logits_of(model, vocab: Vocab, examples: list[D.Example], max_len: int) -> np.ndarray:
    """[N, C] logits of `examples` (one or two texts each) read with the bundle's `vocab`."""
    out = []
    with torch.no_grad():
        for i in range(0, len(examples), BATCH):
            batch = examples[i:i + BATCH]
            inputs = []
            for k in range(len(batch[0].texts)):
                enc = vocab.encode([" ".join(ex.texts[k]) for ex in batch], max_len=max_len)
                inputs += [torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)]
            out.append(model(*inputs).float().numpy())
    return np.concatenate(out)


def choose_offsets(logits: np.ndarray, labels: np.ndarray, step: float, limit: float) -> np.ndarray:
    """The offsets (first class 0, the others on the grid -limit..limit by step) with the best
    accuracy of argmax(logits + offsets); ties go to the smallest total |offset|."""
    grid = np.round(np.arange(-limit, limit + step / 2, step), 6)
    best, best_key = np.zeros(logits.shape[1]), None
    for rest in itertools.product(grid, repeat=logits.shape[1] - 1):
        offsets = np.array([0.0, *rest])
        key = (int(((logits + offsets).argmax(1) == labels).sum()), -float(np.abs(offsets).sum()))
        if best_key is None or key > best_key:
            best, best_key = offsets, key
    return best


def calibrate(checkpoint: Path, bundle: Path, data: Path, out: Path, step: float = 0.05,
              limit: float = 1.0) -> dict[str, Any]:
    """Write `out`: the checkpoint with the chosen offsets added to its head's last bias and a
    `calibration` record (carried into a bundle's manifest `sources`); returns the record."""
    payload = load_checkpoint(checkpoint)
    manifest = load_manifest(bundle)
    model = stored_task_model(payload, manifest["weights"], str(checkpoint))
    classes = model.cfg.num_classes
    if classes > MAX_CLASSES:
        raise ValueError(f"{checkpoint}: {classes} classes; calibrate takes at most {MAX_CLASSES} (on SST-5 "
                         "offsets chosen on dev lowered test accuracy: docs/experiments.md)")
    if BIAS not in payload["model_state"]:
        raise ValueError(f"{checkpoint}: no {BIAS} (an ensemble has one head per member)")
    if payload.get("calibration"):
        raise ValueError(f"{checkpoint}: already calibrated; calibrate the checkpoint it came from")
    name, examples, labels = dev_set(model.cfg.task, classes, data)
    vocab = Vocab.load(bundle / manifest["vocab"])
    logits = logits_of(model, vocab, examples, manifest["max_len"])
    y = np.asarray(labels)
    offsets = choose_offsets(logits, y, step, limit)
    record = {"offsets": [round(float(b), 6) for b in offsets], "labels": payload["labels"], "dev": name,
              "dev_n": len(y), "dev_acc_before": float((logits.argmax(1) == y).mean()),
              "dev_acc_after": float(((logits + offsets).argmax(1) == y).mean()),
              "grid": {"step": step, "limit": limit}, "bundle": manifest.get("name"),
              "from": provenance(checkpoint, payload)}
    state = payload["model_state"]
    state[BIAS] = state[BIAS] + torch.tensor(offsets, dtype=state[BIAS].dtype)
    write_checkpoint(out, payload | {"calibration": record})
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="an NLI or two-class sentiment checkpoint")
    parser.add_argument("--bundle", type=Path, default=Path("models/default"),
                        help="the bundle it will be exported into: its vocabulary and storage")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the staged data")
    parser.add_argument("--out", type=Path, required=True, help="the calibrated checkpoint")
    parser.add_argument("--step", type=float, default=0.05, help="the offsets' grid step")
    parser.add_argument("--limit", type=float, default=1.0, help="the offsets' grid: -limit..limit")


def run(args: argparse.Namespace) -> int:
    if args.step <= 0 or args.limit < 0 or 2 * args.limit / args.step + 1 > MAX_GRID:
        raise ValueError(f"--step {args.step} --limit {args.limit}: give a step above 0, a limit of 0 or "
                         f"more and at most {MAX_GRID} grid points (2 * limit / step + 1)")
    if args.out.resolve() == args.checkpoint.resolve():
        raise ValueError(f"--out {args.out}: give a new file (the checkpoint is the record's source)")
    record = calibrate(args.checkpoint, args.bundle, args.data, args.out, args.step, args.limit)
    print(f"{args.out}: offsets {dict(zip(record['labels'], record['offsets'], strict=True))}; dev "
          f"{100 * record['dev_acc_before']:.2f} -> {100 * record['dev_acc_after']:.2f} "
          f"({record['dev_n']} examples)")
    return 0
