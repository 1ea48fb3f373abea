"""The soft labels a task teacher writes and `disan train --soft-targets` reads (TORCH-FREE).

Which examples a recipe's teacher labels (every distinct training example, keyed by its tokens
joined as training reads them) and the file that holds their logits (`soft.npz`: keys, logits,
columns), shared by both teachers: a fine-tuned sentence-transformer (`disan.distill.task_teacher.cli`) and
trained DiSAN models (`disan.distill.task_teacher.checkpoints`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from disan.data.readers import read_examples
from disan.data.recipes import RECIPES

KEY_SEP = " "  # an example's key: its tokens (disan.text.tokenizer.tokenize) joined, as training reads them


def example_key(tokens: tuple[str, ...]) -> str:
    return KEY_SEP.join(tokens)


def labelled(path: Path, num_classes: int) -> tuple[list[str], list[int]]:
    """(texts as the teacher reads them: tokens joined by spaces, integer labels) of a text/label
    file whose labels are the teacher's classes 0 .. num_classes - 1."""
    _, examples = read_examples(path)
    for ex in examples:
        if ex.label not in {str(c) for c in range(num_classes)}:
            raise ValueError(f"{ex.where}: label {ex.label!r} is not one of the recipe's {num_classes} "
                             f"classes 0..{num_classes - 1}")
    return [example_key(ex.texts[0]) for ex in examples], [int(ex.label) for ex in examples]


def _columns(num_classes: int) -> np.ndarray:
    # column c is the teacher's class c, which `labelled` read as the integer label c
    return np.asarray([str(c) for c in range(num_classes)])


def save_soft_labels(path: Path, keys: list[str], logits: np.ndarray, num_classes: int) -> None:
    """Keys, logits and columns -> compressed .npz (np.load reads it as it reads np.savez's). The
    keys are a fixed-width array as wide as the longest phrase, mostly padding: SST-5's 156,811
    keys took 170 MB stored plain, more than a device reply can bring back."""
    np.savez_compressed(path, keys=np.asarray(keys), logits=logits, labels=_columns(num_classes))


def training_keys(recipe: str, data: Path, train_file: str) -> tuple[list[str], list[str]]:
    """(every distinct training example of `recipe` under the staged `data`, the fine-tuning
    sentences of `train_file`), as keys, each file read once for both labelling steps."""
    num_classes = len(RECIPES[recipe]["label_names"])
    data = Path(data)
    keys = [k for name in RECIPES[recipe]["train"] for k in labelled(data / name, num_classes)[0]]
    return list(dict.fromkeys(keys)), labelled(data / train_file, num_classes)[0]
