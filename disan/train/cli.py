"""`disan train`: recipes for the shipped models, or explicit --task/--train/--dev/--test files.

    disan train --recipe nli  --data ../shared/data --out runs/nli
    disan train --recipe sst5 --data ../shared/data --out runs/sst5
    disan train --task nli --train snli_1.0_train.jsonl --dev snli_1.0_dev.jsonl --test snli_1.0_test.jsonl \
        --glove glove.840B.300d.txt --out runs/snli
    disan train --resume runs/nli/last.pt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from disan.data import readers as D
from disan.data.recipes import RECIPE_VOCAB_FILES, RECIPES, TASK_DEFAULTS
from disan.text.tokenizer import Vocab
from disan.train import word_vectors as E
from disan.train.config import TrainConfig, add_config_arguments, config_values, given_flags
from disan.train.soft_labels import KEY_SEP, example_key

# What `--resume` lets the command line change: how long, where and how often, never the model or
# the data.
RESUME_KNOBS = {"epochs", "max_minutes", "threads", "device", "patience", "eval_every"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the `disan train` options: TrainConfig's fields, plus --data and --resume."""
    p.add_argument("--data", default=os.environ.get("DISAN_DATA", "../shared/data"),
                   help="root of the staged data for --recipe (env DISAN_DATA)")
    p.add_argument("--resume", metavar="LAST_PT", help="continue a run from its last.pt")
    add_config_arguments(p)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Resolve recipe / explicit files and per-task defaults into a TrainConfig."""
    values = config_values(args)
    if args.recipe:
        root = Path(args.data)
        if not root.is_dir():
            raise ValueError(f"{root}: data directory not found (set --data)")
        r = RECIPES[args.recipe]
        recipe = {"task": r["task"], "train": [str(root / f) for f in r["train"]],
                  "dev": str(root / r["dev"]) if "dev" in r else None, "test": str(root / r["test"]),
                  "holdout_from": str(root / r["holdout_from"]) if "holdout_from" in r else None,
                  "label_names": r.get("label_names")}
        if not args.vocab and not args.vocab_texts:
            recipe.update(vocab_texts=[str(root / f) for f in RECIPE_VOCAB_FILES], vocab_texts_only=True)
        # explicit flags win over the recipe's files
        values.update({k: v for k, v in recipe.items() if not values.get(k)})
    if not values.get("task") or not values.get("train"):
        raise ValueError("give --recipe, or --task with --train FILE... (and --dev or --holdout-from)")
    if not values.get("dev") and not values.get("holdout_from"):
        raise ValueError("no dev set: give --dev FILE or --holdout-from FILE")
    if not values.get("out"):
        raise ValueError("--out DIR is required")
    if not 0.0 <= values.get("ema", 0.0) < 1.0:
        raise ValueError(f"--ema {values['ema']}: give a decay in [0, 1) (0 turns the average off)")
    if not 0.0 <= values.get("kd_weight", 0.5) <= 1.0:
        raise ValueError(f"--kd-weight {values['kd_weight']}: give a weight in [0, 1]")
    if values.get("kd_temperature", 1.0) <= 0:
        raise ValueError(f"--kd-temperature {values['kd_temperature']}: give a temperature above 0")
    task_defaults = {**TASK_DEFAULTS[values["task"]], "lr": 1e-3 if values["optimizer"] == "adam" else 0.5}
    for key, default in task_defaults.items():
        if values[key] is None:
            values[key] = default
    return TrainConfig(**values)


def load_splits(cfg: TrainConfig):
    """-> (labels, train, dev, test-or-None) Datasets; dev may be a held-out slice of a train file."""
    train_ex: list[D.Example] = []
    dev_ex = None
    for path in cfg.train:
        task, ex = D.read_examples(path, phrases=cfg.tree_level == "phrase")
        _check_task(cfg, task, path)
        if cfg.holdout_from and Path(path) == Path(cfg.holdout_from):
            ex, dev_ex = D.holdout_split(ex, cfg.holdout, cfg.holdout_seed)
        train_ex += ex
    if cfg.holdout_from and dev_ex is None:
        raise ValueError(f"{cfg.holdout_from}: --holdout-from must be one of the --train files")
    if dev_ex is None:
        task, dev_ex = D.read_examples(cfg.dev)
        _check_task(cfg, task, cfg.dev)
    raw_labels = D.label_set(cfg.task, train_ex)
    names = cfg.label_names or raw_labels
    if len(names) != len(raw_labels):
        raise ValueError(f"{len(names)} label names for {len(raw_labels)} labels {raw_labels}")
    test = None
    if cfg.test:
        task, test_ex = D.read_examples(cfg.test)
        _check_task(cfg, task, cfg.test)
        test = D.make_dataset(cfg.task, test_ex, raw_labels)
    return (list(names), D.make_dataset(cfg.task, train_ex, raw_labels),
            D.make_dataset(cfg.task, dev_ex, raw_labels), test)


def soft_targets(path: str, task: str, train: D.Dataset) -> np.ndarray:
    """A teacher's logits [N, C] of `train`'s examples, in its order and label order, from a
    `disan task-teacher` soft.npz (keys: the examples' tokens joined by spaces)."""
    keys, logits = _teacher_file(path, "--soft-targets", "soft-target", task, train)
    row = {str(k): i for i, k in enumerate(keys)}
    wanted = [example_key(ex.texts[0]) for ex in train.examples]
    missing = [k for k in wanted if k not in row]
    if missing:
        raise ValueError(f"{path}: no teacher logits for {len(missing)} of {len(wanted)} training "
                         f"examples (first: {missing[0][:80]!r})")
    return logits[[row[k] for k in wanted]]


def _teacher_file(path: str, flag: str, kind: str, task: str,
                  train: D.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(keys, logits [N, C] with the columns in `train`'s label order) of a `disan task-teacher` file."""
    if task != "sentiment":
        raise ValueError(f"{flag}: only sentiment tasks have a task teacher")
    try:
        with np.load(path) as z:
            keys, logits, columns = z["keys"], z["logits"], [str(c) for c in z["labels"]]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: not a {kind} file of `disan task-teacher` ({exc})") from exc
    if logits.ndim != 2 or logits.shape != (len(keys), len(columns)):
        raise ValueError(f"{path}: logits of shape {logits.shape} for {len(keys)} keys and "
                         f"{len(columns)} labels")
    raw = D.label_set(task, train.examples)
    if sorted(columns) != sorted(raw):
        raise ValueError(f"{path}: the teacher's labels {columns} are not the training labels {raw}")
    return keys, np.asarray(logits, dtype=np.float32)[:, [columns.index(lab) for lab in raw]]


def add_augmented(path: str, task: str, train: D.Dataset,
                  soft: np.ndarray | None) -> tuple[D.Dataset, np.ndarray]:
    """`train` with the teacher-labelled examples of `path` after its own, their label id -1 (no
    gold label: they learn from the teacher alone), and the soft targets of all of them (NaN for a
    training example the teacher gave no logits, so it learns from its gold label alone)."""
    keys, extra = _teacher_file(path, "--augmented", "teacher-labelled example", task, train)
    examples = [D.Example((tuple(str(k).split(KEY_SEP)),), "", f"{path}:{i + 1}")
                for i, k in enumerate(keys)]
    if any(not ex.texts[0][0] for ex in examples):
        raise ValueError(f"{path}: an empty example")
    if soft is None:
        soft = np.full((len(train), extra.shape[1]), np.nan, dtype=np.float32)
    grown = D.Dataset(task, train.examples + examples, train.label_ids + [-1] * len(examples))
    return grown, np.concatenate([soft, extra])


def teacher_targets(cfg: TrainConfig, train: D.Dataset) -> tuple[D.Dataset, np.ndarray | None]:
    """(`train` with --augmented's examples after its own, the soft targets of every row or None),
    read before any slow work so that a bad teacher file fails at once."""
    soft = soft_targets(cfg.soft_targets, cfg.task, train) if cfg.soft_targets else None
    if cfg.augmented:
        train, soft = add_augmented(cfg.augmented, cfg.task, train, soft)
    return train, soft


def _check_task(cfg: TrainConfig, task: str, path: str) -> None:
    if task != cfg.task:
        raise ValueError(f"{path}: holds {task} data but the task is {cfg.task}")


def prepare_embeddings(cfg: TrainConfig, train: D.Dataset):
    """-> (vocab, embedding matrix [V, d], trainable rows [V], summary dict)."""
    texts = [t for ex in train.examples for t in ex.texts]
    more = [t for path in cfg.vocab_texts for ex in D.read_examples(path)[1] for t in ex.texts]
    vocab = Vocab.load(cfg.vocab) if cfg.vocab else None
    need_glove = cfg.init == "glove" or (vocab is None and cfg.glove_extra > 0)
    vectors = None
    if need_glove:
        if cfg.glove:
            wanted = {w for toks in texts + more for w in toks} | set(vocab.itos if vocab else [])
            vectors = E.load_text_vectors(cfg.glove, wanted, 0 if vocab else cfg.glove_extra)
        else:
            vectors = E.load_glove_package()
    if vocab is None:
        vocab = (E.build_vocab(more, vectors, cfg.glove_extra) if cfg.vocab_texts_only
                 else E.build_vocab(texts, vectors, cfg.glove_extra, more))
    dim = cfg.embed_dim
    if cfg.init == "glove":
        dim = vectors.dim
    elif cfg.init in E.STATIC_SOURCES:
        vectors = E.static_vectors(vocab, dim, cfg.init)
    else:
        vectors = None
    matrix, found = E.init_matrix(vocab, vectors, dim, cfg.seed)
    # --freeze-words: no row moves, so models trained apart can share the table they start from
    trainable = np.zeros(len(vocab), dtype=bool) if cfg.freeze_words else E.trainable_rows(vocab, texts)
    info = {"vocab": len(vocab), "trainable_rows": int(trainable.sum()), "pretrained_rows": found,
            "embed_dim": dim, "source": vectors.source if vectors is not None else "random"}
    return vocab, matrix, trainable, info


def _flag_list(fields: set[str]) -> str:
    return ", ".join(f"--{name.replace('_', '-')}" for name in sorted(fields))


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan train`."""
    # torch is imported here, not at the top: `disan train --help` and bad flags answer at once.
    import torch

    from disan.train.loop import Trainer, new_model, resume_model
    from disan.train.warm_start import load_encoder_weights, load_word_vectors  # torch, as above

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    if args.resume:
        fixed = given_flags(args) - RESUME_KNOBS - {"out", "progress"}
        if fixed:  # refused, not ignored: a run resumed with another --lr would not be that run
            raise ValueError(f"--resume goes on with the run's own settings; {_flag_list(fixed)} cannot "
                             f"change (only {_flag_list(RESUME_KNOBS | {'out'})})")
        ckpt, model, vocab, labels = resume_model(args.resume)
        cfg = TrainConfig(**ckpt["train_config"])
        # Run-time knobs given on the command line replace the run's (a default value too:
        # `--max-minutes 0` lifts a budget); everything that shapes the model stays.
        for key in RESUME_KNOBS & given_flags(args):
            setattr(cfg, key, getattr(args, key))
        cfg.progress = args.progress
        if args.out:
            cfg.out = args.out
        _, train, dev, test = load_splits(cfg)
        train, soft = teacher_targets(cfg, train)
    else:
        ckpt = None
        cfg = config_from_args(args)
        labels, train, dev, test = load_splits(cfg)
        train, soft = teacher_targets(cfg, train)
        vocab, matrix, trainable, info = prepare_embeddings(cfg, train)
        model = new_model(cfg, len(vocab), matrix.shape[1], len(labels), matrix, trainable)
        if cfg.init_encoder:
            metrics = load_encoder_weights(model, cfg.init_encoder, vocab)
            print(f"encoder initialised from {cfg.init_encoder} ({metrics})", file=sys.stderr)
        if cfg.init_words:
            matched = load_word_vectors(model, cfg.init_words, vocab)
            print(f"word vectors from {cfg.init_words} ({matched} of {len(vocab)} rows)", file=sys.stderr)
        print(f"vocab {info['vocab']} words ({info['trainable_rows']} trainable, {info['pretrained_rows']} "
              f"pre-trained from {info['source']}), embed_dim {info['embed_dim']}", file=sys.stderr)
    sizes = {"train": len(train), "dev": len(dev), "test": len(test) if test else 0}
    enc = [D.encode_dataset(ds, vocab, cfg.max_len) if ds else None for ds in (train, dev, test)]
    enc[0].soft = soft
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoder.embed."))
    print(f"{cfg.task}: train {sizes['train']}, dev {sizes['dev']}, test {sizes['test']}; "
          f"{n_params / 1e6:.2f}M parameters excluding embeddings; data ready in "
          f"{time.monotonic() - t0:.0f}s", file=sys.stderr)
    trainer = Trainer(cfg, model, vocab, labels, *enc, sizes=sizes, resume=ckpt)
    final = trainer.fit()
    summary = {k: final[k] for k in ("dev_acc", "test_acc", "stop_reason") if k in final}
    print(json.dumps({"out": cfg.out, "best_step": final["best_step"], **summary, "sizes": sizes}))
    return 0
