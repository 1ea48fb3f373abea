"""Recipes (TORCH-FREE): the staged-data layout and the paper's per-task defaults, in one place.

Paths are relative to the staged data root (`../shared/data`, see its README). Training recipes
(`disan train --recipe`), evaluation (`disan eval --task`), the export's agreement check and the
offline benchmark all read their files from here.
"""

from __future__ import annotations

import math

from disan.bundle.manifest import SST2_LABELS, SST5_LABELS

# Per-task defaults from the paper: dropout keep prob and L2 weight decay.
TASK_DEFAULTS = {"nli": {"keep_prob": 0.75, "weight_decay": 5e-5},
                 "sentiment": {"keep_prob": 0.7, "weight_decay": 1e-4}}

# The NLI recipe's dev set: a held-out slice of SNLI dev (no SNLI train is staged).
HOLDOUT_SIZE, HOLDOUT_SEED = 1500, 2018

# Losses on scored training pairs a distilled student may add (`disan pretrain --pair-loss`).
PAIR_LOSSES = ("mse", "cosent")
# How a run's learning rate falls to 0 over its steps (`disan pretrain --lr-decay`, over its
# --steps; `disan train --lr-decay`, over its --epochs).
LR_DECAYS = ("none", "linear", "cosine")


def decayed_lr(base: float, kind: str, done: int, total: int) -> float:
    """--lr-decay: the learning rate after `done` of this run's `total` steps (to 0 at the end).

    Why: with a constant rate a model wanders around its plateau (a distilled student's STS-B dev,
    a sentiment model's dev accuracy move between evaluations); a rate that falls to zero ends the
    run at a settled point instead of wherever the noise left it."""
    if kind == "none":
        return base
    left = max(0.0, 1.0 - done / max(total, 1))
    return base * (left if kind == "linear" else 0.5 * (1.0 - math.cos(math.pi * left)))


RECIPES = {
    "nli": {"task": "nli", "train": ["mnli/dev_matched.jsonl.gz", "senteval/SICK/sick_train.jsonl.gz",
                                     "snli/dev.jsonl.gz"],
            "holdout_from": "snli/dev.jsonl.gz", "test": "snli/test_tok.jsonl.gz"},
    "sst5": {"task": "sentiment", "train": ["sst/sst5_phrases_train.jsonl.gz"],
             "dev": "sst/sst5_dev.jsonl.gz",
             "test": "sst/sst5_test.jsonl.gz", "label_names": SST5_LABELS},
    "sst2": {"task": "sentiment", "train": ["sst/sst2_phrases_train.jsonl.gz"],
             "dev": "sst/sst2_dev.jsonl.gz",
             "test": "sst/sst2_test.jsonl.gz", "label_names": SST2_LABELS},
}
# Both shipped models must share one vocab (the export requires it), so every recipe builds its
# vocab from the same files, whichever model is trained first; labels are never read from these.
RECIPE_VOCAB_FILES = ["mnli/dev_matched.jsonl.gz", "senteval/SICK/sick_train.jsonl.gz", "snli/dev.jsonl.gz",
                      "sst/sst5_train.jsonl.gz"]

# `disan eval --task`: the default file per task.
EVAL_FILES = {
    "snli": RECIPES["nli"]["test"],
    "mnli": "mnli/dev_matched.jsonl.gz",
    "sick-e": "senteval/SICK/sick_dev.jsonl.gz",
    "sst5": RECIPES["sst5"]["test"],
    "sst2": RECIPES["sst2"]["test"],
}
NLI_EVAL_TASKS = {"snli", "mnli", "sick-e"}

# `disan export --dev-data`: labelled dev sets for the variants' agreement with fp32.
DEV_FILES = {"nli": "snli/dev.jsonl.gz", "sentiment": RECIPES["sst5"]["dev"]}

# bench/offline.py: real sentences of the shipped tasks' test/dev files.
BENCH_SENTENCE_FILES = [RECIPES["nli"]["test"], "mnli/dev_matched.jsonl.gz", RECIPES["sst5"]["test"]]
