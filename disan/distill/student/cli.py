"""`disan distill student`: the flags of `StudentConfig`, then `train_student` (torch)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from disan.distill.student.config import StudentConfig
from disan.distill.student.train import check_inputs, train_student

_HELP = {
    "corpus": "a `disan distill corpus` folder", "out": "run folder (student.pt, metrics.jsonl, pieces.npy)",
    "teacher": "teacher cache (default CORPUS/teacher-mpnet)", "tokenizer": "tokenizer.json (default: the "
    "teacher's WordPiece)", "dims": "Matryoshka prefixes trained to be vectors (the first is the whole)",
    "relations": "pair relations to train on (default: all the corpus has)",
    "resume": "go on from OUT/state.pt (written at each evaluation) with the same flags",
    "rotate_teacher": "distil into the teacher's space turned onto its principal axes, every prefix",
    "init": "start from this student's weights (same shape and tokenizer), with a new optimizer and "
    "schedule and no head fit",
    "layers": "directional layers; an --init student with fewer grows (each new layer starts as a "
    "pass-through)",
    "table_lr_scale": "the token table's learning rate, times --lr (--tune all)",
    "tune": "all; rows: only the table rows the --init student marks trainable; head: only the projection; "
    "blocks: all but the token table",
    "static_start": "set the blocks so that the untrained student reads its table as a static encoder does "
    "(the mean of its rows), before the head is fitted",
    "windows": "read a text longer than --max-pieces in windows of that many pieces, pooled as the "
    "embed route pools them, instead of cutting it there",
    "length_buckets": "length-sorted parts a batch runs as (less padding; the loss is the same)",
    "anchor": "share of each target that is the --init student's own vector (0: the teacher alone)",
    "anchor_rows": "with --anchor 1 (no teacher read): the corpus rows the phase trains on",
    "whiten_targets": "distil the teacher's vectors through the --init head's whitening map "
    "(research.whiten_head), the coordinates that student serves",
    "data": "staged data folder (../shared/data) for the labelled terms (--scored-weight, "
    "--sentiment-weight, --nli-weight, --nli-classes-weight)",
    "scored_weight": "weight of the STS-B and SICK train pairs' scores (MSE on the cosine)",
    "sentiment_weight": "weight of the SST-5 train phrases' labels (a training-only head, probed first)",
    "nli_weight": "weight of the NLI train triples (premise -> its entailed hypothesis, in-batch ranking "
    "with the contradicting ones as hard negatives)",
    "nli_classes_weight": "weight of the NLI train pairs' three classes (a training-only head on [u, v, "
    "|u - v|, u * v], probed first; SICK train left out: SICK-E fits on it)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(StudentConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = _HELP.get(f.name)
        if f.name in ("corpus", "out"):
            parser.add_argument(flag, type=Path, required=True, help=help_text)
        elif f.name in ("dims", "relations"):
            kind = int if f.name == "dims" else str
            parser.add_argument(flag, type=kind, nargs="+", default=list(f.default_factory()
                                if f.default is dataclasses.MISSING else f.default), help=help_text)
        elif f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(f.type).split(" |")[0], None)
            if f.name in ("teacher", "tokenizer", "init", "data"):
                kind = Path
            elif f.name == "max_minutes":
                kind = float
            elif f.name == "threads":
                kind = int
            parser.add_argument(flag, type=kind, default=f.default, help=help_text)
    parser.add_argument("--check", action="store_true",
                        help="only read the inputs a run reads before the teacher's rows (corpus, --init "
                        "and its whitening map, tokenizer, --data files) and stop: a lease runs this "
                        "before its teacher")


def config(args: argparse.Namespace) -> StudentConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(StudentConfig)}
    values["dims"], values["relations"] = tuple(values["dims"]), tuple(values["relations"])
    return StudentConfig(**values)


def run(args: argparse.Namespace) -> int:
    cfg = config(args)
    if args.check:
        print(check_inputs(cfg))
        return 0
    encode = None
    if cfg.starts_fresh and not (cfg.out / "pieces.npy").is_file():  # --resume/--init carry the table
        from disan.distill.teacher import sentence_transformer_encoder  # only for a first run: loads MPNet

        encode = sentence_transformer_encoder("mpnet", "fp32", batch_size=256, device=cfg.device)
    train_student(cfg, teacher_encode=encode)
    return 0
