"""Recipes (TORCH-FREE): the staged-data layout and the paper's per-task defaults, in one place.

Paths are relative to the staged data root (`../shared/data`, see its README). Training recipes
(`disan train --recipe`), evaluation (`disan eval --task`), the export's agreement check and the
offline benchmark all read their files from here.
"""

from __future__ import annotations

from disan.manifest import SST2_LABELS, SST5_LABELS

# Per-task defaults from the paper: dropout keep prob and L2 weight decay.
TASK_DEFAULTS = {"nli": {"keep_prob": 0.75, "weight_decay": 5e-5},
                 "sentiment": {"keep_prob": 0.7, "weight_decay": 1e-4}}

# The NLI recipe's dev set: a held-out slice of SNLI dev (no SNLI train is staged).
HOLDOUT_SIZE, HOLDOUT_SEED = 1500, 2018

# Losses on scored training pairs a distilled student may add (`disan pretrain --pair-loss`).
PAIR_LOSSES = ("mse", "cosent")
# How a distillation phase's learning rate falls to 0 over its --steps (`disan pretrain --lr-decay`).
LR_DECAYS = ("none", "linear", "cosine")

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
