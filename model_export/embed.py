"""A distilled sentence encoder in a bundle (`disan export --embed CKPT`): its vocabulary, its table.

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

from disan.checkpoint import load_checkpoint, model_from_checkpoint
from disan.model import DiSANConfig, DiSANEncoder
from disan.text import UNK, Vocab

TASK = "encoder"  # the checkpoint task of `disan pretrain` / distillation students


def load_embed(path: Path) -> tuple[dict[str, Any], DiSANEncoder, Vocab]:
    """(payload, encoder, its own vocabulary) of a distilled encoder checkpoint."""
    payload = load_checkpoint(path)
    model, vocab, _ = model_from_checkpoint(payload)
    if model.cfg.task != TASK:
        raise ValueError(f"{path}: is a '{model.cfg.task}' checkpoint, expected a sentence encoder "
                         f"(task '{TASK}', from `disan pretrain`) for --embed")
    return payload, model, vocab


def merged_vocab(base: Vocab, extra: Vocab) -> Vocab:
    """`base`'s words, then `extra`'s words `base` lacks, in `extra`'s order; `extra`'s hashed
    unknown rows (its last words) stay the last ones, so they must be words `base` lacks."""
    k = extra.unknown_rows
    merged = Vocab([*base.itos[2:], *(w for w in extra.itos[2:] if w not in base)], unknown_rows=k)
    if k and merged.itos[-k:] != extra.itos[-k:]:
        raise ValueError(f"the encoder's last {k} words stand for unknown words, but the NLI/sentiment "
                         f"vocabulary has some of them: they would not stay last in the bundle's")
    return merged


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
