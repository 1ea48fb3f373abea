"""`disan borrow-words MODEL ENCODER OUT`: an NLI or sentiment model that reads every word the
bundle's embedding encoder knows, instead of reading the words past its own table as UNK.

A bundle has one vocabulary: the task models' words, then the distilled encoder's words they lack
(`disan.text.tokenizer.merged_vocab`). The task models' tables end where their own words end, so a review
that says "applaud" or "cozy" (past the sentiment model's 31k words, known to the encoder) reads
those words as UNK. This fits one linear map (least squares, with a bias) from the encoder's word
vectors to the model's, over the words both know, and gives the model the encoder's table, in
the bundle's order, as a buffer read through that map for every id past its own table
(`disan.model.DiSANEncoder`). The model's own rows and every other weight stay as they were, so a
text made only of its own words reads exactly as before.

In a bundle the borrowed table is the encoder's own table, the same bytes, stored once
(`model_export.graphs.storage`): the export checks that it is, so the map always reads the rows it was
fitted to. What it costs there is the map, d_e x (d_e + 1) floats.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from disan.distill.vocab_extend import fit_map
from disan.model import BORROWED_KEY
from disan.text.tokenizer import UNK, merged_vocab
from disan.train.checkpoint import (
    PROVENANCE_KEYS,
    checkpoint_vocab,
    load_checkpoint,
    provenance,
    write_checkpoint,
)

TASKS = ("nli", "sentiment")  # models with an `encoder.` of their own (a bare encoder has no gap)
PREFIX = "encoder."


def lender_rows(lender: dict, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the encoder's word vectors in the order of `words` [len, d], which of them it knows): a
    word it lacks, or one that carries its UNK row (recovered checkpoints have some), is unknown."""
    table = lender["model_state"]["embed.weight"].float().numpy()
    stoi = {w: i for i, w in enumerate(lender["vocab"])}
    ids = np.array([stoi.get(w, UNK) for w in words])
    known = (ids > UNK) & ~np.all(table[ids] == table[UNK], axis=1)
    return table[ids], known


def unborrowed(payload: dict) -> dict:
    """`payload` without the words it borrows: its own table, vocabulary and weights, which
    borrowing left as they were (so borrowing again, e.g. from an encoder that knows more words,
    starts where the first borrowing did)."""
    config = payload["config"]
    if not config.get("borrowed_rows"):
        return payload
    borrowed = (BORROWED_KEY, PREFIX + "borrow_map.weight", PREFIX + "borrow_map.bias")
    state = {k: v for k, v in payload["model_state"].items() if k not in borrowed}
    out = {**payload, "config": dict(config) | {"borrowed_rows": 0, "borrowed_dim": 0},
           "vocab": list(payload["vocab"])[: config["vocab_size"]], "model_state": state}
    out.pop("unknown_rows", None)  # the bundle's (the lender's); the model's own ids never use them
    return out


def borrow_words(payload: dict, lender: dict) -> tuple[dict, dict]:
    """(`payload`'s model reading `lender`'s words past its own table, a report)."""
    task = payload["config"].get("task")
    if task not in TASKS:
        raise ValueError(f"borrow-words takes an NLI or sentiment checkpoint, not task '{task}'")
    if lender["config"].get("task") != "encoder":
        raise ValueError(f"the lender must be a sentence encoder checkpoint (task 'encoder', from "
                         f"`disan pretrain`), not task '{lender['config'].get('task')}'")
    payload = unborrowed(payload)  # a model that borrows already: from a new encoder instead
    state = dict(payload["model_state"])
    own = state[PREFIX + "embed.weight"].float().numpy()                 # [n_own, d_e]
    vocab = merged_vocab(checkpoint_vocab(payload), checkpoint_vocab(lender))
    lent, known = lender_rows(lender, vocab.itos)                       # [V, d_b], [V]
    fit = np.flatnonzero(known[: len(own)])
    if len(fit) <= lent.shape[1] + 1:
        raise ValueError(f"the two models share {len(fit)} known words: too few to fit a map from "
                         f"{lent.shape[1]} dimensions (are they over the same language?)")
    mapping, cosine = fit_map(lent[fit].astype(np.float64), own[fit].astype(np.float64))  # [d_b+1, d_e]
    state[BORROWED_KEY] = torch.from_numpy(np.ascontiguousarray(lent, dtype=np.float32))
    state[PREFIX + "borrow_map.weight"] = torch.from_numpy(mapping[:-1].T.astype(np.float32))
    state[PREFIX + "borrow_map.bias"] = torch.from_numpy(mapping[-1].astype(np.float32))
    config = dict(payload["config"]) | {"borrowed_rows": len(lent), "borrowed_dim": lent.shape[1]}
    report = {"own_words": len(own), "bundle_words": len(vocab), "lent_words": int(known[len(own):].sum()),
              "fit_words": len(fit), "fit_heldout_cosine": round(cosine, 4)}
    out = {**payload, "config": config, "vocab": vocab.itos, "model_state": state}
    out.pop("unknown_rows", None)
    if vocab.unknown_rows:
        out["unknown_rows"] = vocab.unknown_rows
    return out, report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="an NLI or sentiment checkpoint (disan train)")
    parser.add_argument("encoder", type=Path, help="the sentence encoder the bundle serves /embed with "
                        "(`disan export --embed`): its words and word vectors are lent")
    parser.add_argument("out", type=Path, help="where to write the checkpoint that borrows them")


def run(args: argparse.Namespace) -> int:
    payload, lender = load_checkpoint(args.checkpoint), load_checkpoint(args.encoder)
    borrowed, report = borrow_words(payload, lender)
    # Optimizer state no longer fits the model's parameters; where the input came from moves
    # under `borrowing`: this file was made, not recovered or trained.
    dropped = ("optimizer_state", "student_state", *PROVENANCE_KEYS)
    out = {k: v for k, v in borrowed.items() if k not in dropped}
    out["borrowing"] = report | {"from": provenance(args.checkpoint, payload),
                                 "lender": provenance(args.encoder, lender)}
    write_checkpoint(args.out, out)
    print(f"{args.out}: reads {report['lent_words']} more words through the encoder's table "
          f"({report['bundle_words']} in all; map fitted on {report['fit_words']} shared words, "
          f"held-out cosine {report['fit_heldout_cosine']})")
    return 0
