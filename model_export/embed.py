"""A distilled sentence encoder in a bundle (`disan export --embed CKPT`): its vocabulary, its table.

An encoder that reads subword pieces (`disan distill student`) keeps its own table and ids: the
bundle carries its tokenizer.json, and the manifest names it for the encoder's graphs
(`piece_tokenizer`). What follows is about an encoder that reads words.

A bundle has one `vocab.json`, and the NLI and sentiment models were trained on one vocabulary
while a distilled encoder (`disan pretrain --corpus`) brings its own. The bundle's vocabulary is
the NLI model's followed by the encoder's words it lacks, in the encoder's order: the NLI and
sentiment ids stay what they were (their tables are not touched), and the ids appended after
them are unknown words to those models (`disan.model.DiSANEncoder` reads them as UNK). The
encoder's table is re-indexed to the bundle's order, a bundle word it never saw getting its UNK
row, so the re-indexed encoder gives every text exactly the vectors the checkpoint gives it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from disan.bundle.manifest import matryoshka_dims
from disan.model import DiSANConfig, DiSANEncoder
from disan.text.pieces import PieceTokenizer
from disan.text.tokenizer import UNK, Vocab
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint

TASK = "encoder"  # the checkpoint task of `disan pretrain` / distillation students


def load_embed(path: Path) -> tuple[dict[str, Any], DiSANEncoder, Vocab]:
    """(payload, encoder, its own vocabulary) of a distilled encoder checkpoint."""
    payload = load_checkpoint(path)
    model, vocab, _ = model_from_checkpoint(payload)
    if model.cfg.task != TASK:
        raise ValueError(f"{path}: is a '{model.cfg.task}' checkpoint, expected a sentence encoder "
                         f"(task '{TASK}', from `disan pretrain`) for --embed")
    trained = payload.get("matryoshka_dims")  # the sizes it was trained to serve: the manifest's
    if trained is not None:
        trained = list(trained) if isinstance(trained, tuple) else trained
        matryoshka_dims({"matryoshka_dims": trained}, getattr(model, "encoder", model).out_dim, where=path)
    return payload, model, vocab


def piece_tokenizer(payload: dict[str, Any]) -> PieceTokenizer | None:
    """The subword tokenizer a piece encoder checkpoint carries (`disan distill student`), None
    for a word encoder. A piece encoder is exported as it is, with its tokenizer.json beside the
    bundle's vocab.json: its graphs read piece ids (disan.bundle.manifest.graph_tokenizer)."""
    text = payload.get("tokenizer")
    return PieceTokenizer.from_str(text) if text else None


def reindexed(encoder: DiSANEncoder, own: Vocab, bundle: Vocab) -> DiSANEncoder:
    """A copy of `encoder` whose table rows follow `bundle`'s ids (a word missing from `own` gets
    the UNK row; PAD and UNK keep theirs). Same outputs on any text, ids from `bundle`."""
    rows = torch.tensor([own.stoi.get(word, UNK) for word in bundle.itos])
    cfg = DiSANConfig.from_dict({**encoder.cfg.to_dict(), "vocab_size": len(bundle)})
    out = DiSANEncoder(cfg)
    state = encoder.state_dict()
    state["embed.weight"] = state["embed.weight"][rows].clone()
    state["trainable_rows"] = state["trainable_rows"][rows].clone()  # training only; kept consistent
    out.load_state_dict(state)
    out.chunk_cells = encoder.chunk_cells
    return out.eval()


def same_table(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two word tables hold the same rows: what lets the bundle store them once."""
    return a.shape == b.shape and torch.equal(a, b)


def check_borrowed(borrowers: dict[str, DiSANEncoder], embed: DiSANEncoder | None) -> None:
    """Raise ValueError unless every task encoder in `borrowers` (task: encoder) borrowed exactly
    the table of `embed`, the bundle's encoder re-indexed (`disan borrow-words`): its map was
    fitted to those rows, and the bundle stores the table once, for both."""
    for task, encoder in borrowers.items():
        if embed is None:
            raise ValueError(f"the {task} model reads words through a sentence encoder's table "
                             "(disan borrow-words): export it with that encoder as --embed")
        if not same_table(encoder.borrowed, embed.embed.weight):
            raise ValueError(f"the {task} model borrowed another table than --embed's ("
                             f"{tuple(encoder.borrowed.shape)} against {tuple(embed.embed.weight.shape)} "
                             "in the bundle's order, or other values): run `disan borrow-words` "
                             "again with this --embed")


def check_whole_words(embed: DiSANEncoder, borrowers: dict[str, DiSANEncoder]) -> None:
    """Raise ValueError unless the piece encoder `embed` reads whole words (`disan distill
    whole-words`) from exactly the table the task models in `borrowers` borrowed: the bundle stores
    that table once, for all of them."""
    if not borrowers:
        raise ValueError("the encoder reads whole words through a word table, and no NLI or sentiment "
                         "model borrows one (disan borrow-words) for the bundle to share it with")
    for task, encoder in borrowers.items():
        mine, theirs = embed.borrowed, encoder.borrowed
        if not same_table(mine, theirs):
            raise ValueError(f"the encoder reads whole words from another table than the {task} model "
                             f"borrowed ({tuple(mine.shape)} against {tuple(theirs.shape)}, or other "
                             "values): run `disan distill whole-words` with that model's checkpoint")


def as_stored(models: dict[str, Any], storage: dict[str, str],
              matrices: dict[str, str] | None = None, keep_borrowed: bool = False) -> None:
    """Make `models` ({task: model}, "embed" the re-indexed encoder) the models a bundle holds, in
    place: each table rounded to its `storage` ({task: storage}), every other parameter to its
    `matrices` storage (default fp32), and a task model that borrows words given the encoder's
    table as stored (after check_borrowed): the references of the parity checks, at export and
    at `disan verify`. `keep_borrowed` (the encoder reads subword pieces): the task models keep
    the word table they borrowed, rounded to `storage["borrowed"]`, instead of the encoder's."""
    from model_export.graphs.storage import (  # onnx: with torch, in the train extra
        BORROWED,
        round_matrices,
        round_table,
        round_tables,
    )

    borrowers = {task: model.encoder for task, model in models.items()
                 if task != "embed" and model.cfg.borrowed_rows}
    if not keep_borrowed:
        check_borrowed(borrowers, models.get("embed"))
    whole = models.get("embed") if keep_borrowed and models["embed"].cfg.borrowed_rows else None
    if whole is not None:
        check_whole_words(whole, borrowers)
        round_table(whole.borrowed, storage.get(BORROWED, "fp32"), "embed (the words it reads whole)")
    for task, model in models.items():
        round_tables([model], storage[task])
        round_matrices(model, (matrices or {}).get(task, "fp32"))
    for task, encoder in borrowers.items():
        if keep_borrowed:  # both models' copies are the same table: the same bytes, stored once
            round_table(encoder.borrowed, storage.get(BORROWED, "fp32"), f"{task} (its borrowed words)")
        else:  # the same values as the encoder's: one copy in the weights file
            encoder.borrowed.copy_(models["embed"].embed.weight.detach())


def task_model_as_stored(model, task: str, storage: dict[str, str], matrices: dict[str, str]) -> None:
    """An NLI or sentiment `model` as a bundle with these storages ({task: storage}, as its
    manifest's `weights` records them) would hold it, in place, without the encoder at hand: what
    as_stored does, with the borrowed copy of the encoder's table rounded as the encoder's own
    table is stored (the values as_stored copies in), or, beside a piece encoder, as the bundle
    stores the word table itself (storage `borrowed`). To compare checkpoints before exporting one
    (research/analyses/sentiment_served.py)."""
    from model_export.graphs.storage import (  # onnx: as as_stored
        BORROWED,
        round_matrices,
        round_table,
        round_tables,
    )

    round_tables([model], storage[task])
    round_matrices(model, matrices.get(task, "fp32"))
    if model.cfg.borrowed_rows:
        lent = storage.get(BORROWED, storage["embed"])
        round_table(model.encoder.borrowed, lent, f"{task} (its borrowed words)")
