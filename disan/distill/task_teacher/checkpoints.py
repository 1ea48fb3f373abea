"""`disan task-teacher --checkpoints CKPT...`: trained sentiment models as the teacher.

The mean of several models' class probabilities is steadier than any one of them (on SST-5 the
lease's seeds and the shipped model averaged to a higher test accuracy than each alone), but an
ensemble costs its members' tables and time in serving. Distillation moves it into one model:
these logits of the recipe's training examples, in `disan task-teacher`'s soft.npz format, are
what `disan train --soft-targets` learns from. No fine-tuning: the checkpoints are the teacher.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from disan.data import readers as D
from disan.data.recipes import RECIPES
from disan.distill.config import TaskTeacherConfig
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint
from disan.train.loop import predict_logits
from disan.train.soft_labels import KEY_SEP, save_soft_labels, training_keys


def mean_probability_logits(paths: Sequence[str], examples: Sequence[tuple[str, ...]],
                            label_names: Sequence[str], max_cells: int = 64 ** 3) -> np.ndarray:
    """log of the mean of the checkpoints' class probabilities [len(examples), C] of the token
    tuples `examples` (softmax of it is that mean). Column c is the raw label str(c), as `disan
    task-teacher` writes them; a model names its classes by the raw labels or by the recipe's
    `label_names` (raw label c's name)."""
    raw = [str(c) for c in range(len(label_names))]
    rows = [D.Example(texts=(tokens,), label=raw[0], where=f"example {i}")
            for i, tokens in enumerate(examples)]
    total = np.zeros((len(rows), len(raw)), dtype=np.float64)
    for path in paths:
        payload = load_checkpoint(path)
        if payload.get("config", {}).get("task") != "sentiment":
            raise ValueError(f"{path}: not a sentiment checkpoint")
        model, vocab, labels = model_from_checkpoint(payload)
        names = next((n for n in (raw, list(label_names)) if sorted(labels) == sorted(n)), None)
        if names is None:
            raise ValueError(f"{path}: its labels {labels} are not the recipe's {list(label_names)}")
        data = D.encode_dataset(D.make_dataset("sentiment", rows, raw), vocab, None)  # labels unused
        logits = torch.from_numpy(predict_logits(model, data, torch.device("cpu"), max_cells))
        probs = torch.softmax(logits.double(), dim=-1).numpy()
        total += probs[:, [labels.index(name) for name in names]]
    return np.log(total / len(paths)).astype(np.float32)


def label_with_checkpoints(cfg: TaskTeacherConfig, out: Path) -> int:
    """--checkpoints: their mean probabilities of every training example -> `soft.npz`."""
    if cfg.augment:
        raise ValueError("--augment labels variants with a fine-tuned teacher, not with --checkpoints")
    if cfg.unlabelled:
        raise ValueError("--unlabelled labels a corpus with a fine-tuned teacher, not with --checkpoints")
    for path in cfg.checkpoints:  # one line before any slow work
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such checkpoint")
    label_names = RECIPES[cfg.recipe]["label_names"]
    num_classes = len(label_names)
    keys, _ = training_keys(cfg.recipe, cfg.data, cfg.train_file)
    logits = mean_probability_logits(cfg.checkpoints, [tuple(k.split(KEY_SEP)) for k in keys], label_names)
    out.mkdir(parents=True, exist_ok=True)
    save_soft_labels(out / "soft.npz", keys, logits, num_classes)
    info = {"teacher": "checkpoints", "checkpoints": list(cfg.checkpoints), "recipe": cfg.recipe,
            "examples": len(keys)}
    (out / "checkpoint_teacher.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"soft targets: {out / 'soft.npz'} ({len(keys)} examples, the mean of "
          f"{len(cfg.checkpoints)} checkpoints)")
    return 0
