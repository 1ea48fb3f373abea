"""The kept task teacher's labels (`disan task-teacher`, after the fit): its logits of every
training example (`soft.npz`), of `--augment`'s variants (`augmented.npz`) and of `--unlabelled`'s
corpus sentences (`unlabelled_<folder>.npz`), each written in resumable chunks (`label_chunks`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from disan.bundle.manifest import sha256_file
from disan.data.recipes import RECIPES
from disan.distill.config import TaskTeacherConfig
from disan.distill.corpus.build import read_corpus
from disan.distill.task_teacher.augment import MASK, Augmenter
from disan.distill.task_teacher.classifier import Classifier, predict
from disan.text.tokenizer import tokenize
from disan.train.soft_labels import KEY_SEP, example_key, save_soft_labels


def class_count(recipe: str) -> int:
    """How many classes the recipe's labels have: the width of every logits array written here."""
    return len(RECIPES[recipe]["label_names"])


def label_chunks(cfg: TaskTeacherConfig, out: Path, folder: Path, keys: list[str],
                 num_classes: int, extra: dict | None = None) -> np.ndarray:
    """The kept teacher's logits [N, C] of `keys`, written in chunks to `folder` (resumable: the
    rows on disk count only for the same examples, teacher weights and `extra` settings)."""
    import torch  # optional (`train` extra)

    folder.mkdir(exist_ok=True)
    progress = folder / "progress.json"
    store = folder / "logits.f32.npy"
    state = {"rows": len(keys), "teacher_sha256": sha256_file(out / "teacher.pt"), **(extra or {})}
    recorded = json.loads(progress.read_text()) if progress.is_file() else {}
    if {k: recorded.get(k) for k in state} != state:
        np.lib.format.open_memmap(store, "w+", np.float32, (len(keys), num_classes)).flush()
        progress.write_text(json.dumps({**state, "done": 0}))
    done = json.loads(progress.read_text())["done"]
    logits = np.load(store, mmap_mode="r+")
    if done < len(keys):
        model = Classifier(cfg.teacher, num_classes, cfg.device)
        model.load_state_dict(torch.load(out / "teacher.pt", map_location=cfg.device))
        texts = [k.replace(MASK, model.tokenizer.mask_token) for k in keys]  # MPNet's is MASK itself
    while done < len(keys):
        end = min(done + cfg.chunk, len(keys))
        logits[done:end] = predict(model, texts[done:end], cfg.batch_size * 4, cfg.precision)
        logits.flush()
        done = end
        progress.write_text(json.dumps({**state, "done": done}))
        print(json.dumps({"labelled": done, "of": len(keys), "in": folder.name}), flush=True)
    return np.asarray(logits)


def label(cfg: TaskTeacherConfig, out: Path, keys: list[str], sentences: list[str]) -> Path:
    """The kept teacher's logits of every training example of the recipe (`keys`) -> `soft.npz`."""
    num_classes = class_count(cfg.recipe)
    logits = label_chunks(cfg, out, out / "soft", keys, num_classes)
    target = out / "soft.npz"
    save_soft_labels(target, keys, logits, num_classes)
    # the same with NaN (no opinion) for every example that is not a sentence the teacher was
    # fine-tuned on: a student taught on whole sentences only, phrases from their gold labels
    fine_tuned = set(sentences)
    only = np.where(np.asarray([k in fine_tuned for k in keys])[:, None], logits, np.nan)
    save_soft_labels(out / "soft_sentences.npz", keys, only.astype(np.float32), num_classes)
    return target


def label_augmented(cfg: TaskTeacherConfig, out: Path, keys: list[str], sentences: list[str]) -> Path:
    """`--augment N` variants of each fine-tuning sentence (`disan.distill.task_teacher.augment`),
    none of them a training example (`keys`), and the kept teacher's logits of them -> `augmented.npz`, the
    examples `disan train --augmented` learns from the teacher alone."""
    num_classes = class_count(cfg.recipe)
    tokens = [tuple(k.split(KEY_SEP)) for k in sentences]
    taken = {tuple(k.split(KEY_SEP)) for k in keys}
    variants = Augmenter(tokens).augment(tokens, cfg.augment, cfg.seed, exclude=taken)
    new_keys = [example_key(v) for v in variants]
    logits = label_chunks(cfg, out, out / "augmented", new_keys, num_classes,
                          extra={"augment": cfg.augment, "seed": cfg.seed})
    target = out / "augmented.npz"
    save_soft_labels(target, new_keys, logits, num_classes)
    return target


def label_unlabelled(cfg: TaskTeacherConfig, out: Path, keys: list[str]) -> Path:
    """The sentences of the `disan corpus` folder `--unlabelled` that are not training examples
    (`keys`), each once, and the kept teacher's logits of them -> `unlabelled_<folder>.npz`, extra
    examples that `disan train --augmented` learns from the teacher alone."""
    num_classes = class_count(cfg.recipe)
    folder = Path(cfg.unlabelled)
    sentences, info = read_corpus(folder)
    taken = set(keys)
    new_keys = [k for k in dict.fromkeys(example_key(tuple(tokenize(s))) for s in sentences)
                if k and k not in taken]
    name = f"unlabelled_{folder.resolve().name}"
    logits = label_chunks(cfg, out, out / name, new_keys, num_classes,
                          extra={"corpus_sha256": info["sha256"]})
    target = out / f"{name}.npz"
    save_soft_labels(target, new_keys, logits, num_classes)
    return target
