"""`disan ensemble FIRST MEMBER... --out OUT`: sentiment models trained apart over one word table,
joined into one model whose class probabilities are the mean of theirs.

Five-way sentiment is where one model's seed moves test accuracy by a point or more, and the
mean of a few models' probabilities is steadier and better than any one of them. What makes it
cheap here is that the members share the first model's word table: each later member is trained
with that table frozen (`disan train --init-words FIRST --freeze-words`), so the ensemble stores
the table once and reads a text's words once (`disan.model.SentimentModel` with
`members` > 1). What each member adds is its attention blocks and head, about 2 MB in fp32 at
d_h 150. The first model may borrow words (`disan borrow-words`); the members then read the
borrowed words through it too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from disan.train.checkpoint import PROVENANCE_KEYS, load_checkpoint, provenance, write_checkpoint

TABLE = "encoder.embed.weight"
# What a member need not carry: the table (read from the first model) and its trainable-row mask.
# (A member never borrows words: check_member refuses one that does.)
FIRST_ONLY = (TABLE, "encoder.trainable_rows")
# Config fields every member must share with the first model (the rest: its table and borrowing).
SHAPE = ("embed_dim", "d_h", "c", "activation", "keep_prob", "attention_kind", "mask_kind", "coda_gate",
         "s2t_kind", "encoder_kind", "task", "num_classes", "head_dim", "proj_dim")


def check_member(first: dict, member: dict, name: str) -> None:
    """Raise ValueError unless `member` can join `first`'s ensemble."""
    a, b = first["config"], member["config"]
    if b.get("task") != "sentiment":
        raise ValueError(f"{name}: ensemble takes sentiment checkpoints, not task '{b.get('task')}'")
    if b.get("members", 1) > 1:
        raise ValueError(f"{name}: already an ensemble; join its members instead")
    if b.get("borrowed_rows"):
        raise ValueError(f"{name}: a later member must not borrow words (only the first model reads them)")
    differ = [k for k in SHAPE if a.get(k) != b.get(k)]
    if differ:
        raise ValueError(f"{name}: differs from the first model in {', '.join(differ)}")
    if first.get("labels") != member.get("labels"):
        raise ValueError(f"{name}: labels {member.get('labels')} differ from the first model's "
                         f"{first.get('labels')}")
    ours, theirs = first["model_state"][TABLE], member["model_state"][TABLE]
    rows = theirs.shape[0]
    same_words = first["vocab"][:rows] == member["vocab"][:rows]
    if ours.shape != theirs.shape or not same_words or not torch.equal(ours, theirs):
        raise ValueError(f"{name}: its word table is not the first model's (train it with `disan train "
                         f"--init-words FIRST --freeze-words` over the first model's vocabulary)")


def join(first: dict, members: list[dict], names: list[str]) -> dict:
    """The ensemble checkpoint: `first` with each member's encoder and head under `others.K.`."""
    if first["config"].get("task") != "sentiment" or first["config"].get("members", 1) > 1:
        raise ValueError("the first model must be a single sentiment checkpoint")
    if not members:
        raise ValueError("give at least one member besides the first model")
    state = dict(first["model_state"])
    for k, (member, name) in enumerate(zip(members, names, strict=True)):
        check_member(first, member, name)
        for key, value in member["model_state"].items():
            if not key.startswith(FIRST_ONLY):
                state[f"others.{k}.{key}"] = value
    config = dict(first["config"]) | {"members": 1 + len(members)}
    return {**first, "config": config, "model_state": state}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("first", type=Path, help="the sentiment checkpoint whose word table the members "
                        "share (it may borrow words: `disan borrow-words`)")
    parser.add_argument("members", type=Path, nargs="+", help="sentiment checkpoints trained over that table "
                        "(`disan train --init-words FIRST --freeze-words`)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the ensemble checkpoint")


def run(args: argparse.Namespace) -> int:
    first = load_checkpoint(args.first)
    members = [load_checkpoint(p) for p in args.members]
    joined = join(first, members, [str(p) for p in args.members])
    dropped = ("optimizer_state", "student_state", "metrics", *PROVENANCE_KEYS)
    out = {k: v for k, v in joined.items() if k not in dropped}
    out["ensemble"] = {"first": provenance(args.first, first),
                       "members": [provenance(p, m) for p, m in zip(args.members, members, strict=True)]}
    write_checkpoint(args.out, out)
    print(f"{args.out}: {1 + len(members)} sentiment models over one word table")
    return 0
