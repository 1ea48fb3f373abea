"""A new task model that starts from another checkpoint's weights (`disan train --init-encoder`,
`--init-words`). Torch.

Word-vector rows are matched by word, so the checkpoint may have another vocabulary than the run
(e.g. the bundle's shared one, or a distilled student's larger one): each word the checkpoint
knows takes its row, and the others keep this run's initial vectors.
"""

from __future__ import annotations

import torch

from disan.model import DiSANConfig
from disan.text.tokenizer import UNK
from disan.train.checkpoint import load_checkpoint


def load_encoder_weights(model: torch.nn.Module, path: str, vocab) -> dict:
    """Copy the encoder of checkpoint `path` (an `encoder`, NLI or sentiment checkpoint) into `model`.

    With the checkpoint's own vocab.json (`--vocab`) the table is copied whole, otherwise row by
    word. This run's trainable-row mask is kept, so words outside its training data stay frozen
    at the values they start from.
    """
    ckpt = load_checkpoint(path)
    enc_state = _encoder_state(ckpt)
    enc_state["trainable_rows"] = model.encoder.trainable_rows.clone()
    if not model.encoder.cfg.proj_dim:
        # a distilled student's map into its teacher's space (`pretrain --serve-proj`): a task
        # model's head reads DiSAN's own 2*d_h vector, so the map has nowhere to go
        enc_state = {k: v for k, v in enc_state.items() if not k.startswith("proj.")}
    old = DiSANConfig.from_dict(ckpt["config"])
    new = model.encoder.cfg
    for key in ("embed_dim", "d_h", "attention_kind", "mask_kind", "activation"):
        if getattr(old, key) != getattr(new, key):
            raise ValueError(f"{path}: --init-encoder has {key}={getattr(old, key)!r}, "
                             f"this run {getattr(new, key)!r}")
    matched = len(vocab)
    if ckpt["vocab"] != vocab.itos:
        enc_state["embed.weight"], matched = _rows_by_word(
            enc_state["embed.weight"], ckpt["vocab"], model.encoder.embed.weight.detach(), vocab.itos,
            f"{path}: --init-encoder")
    model.encoder.load_state_dict(enc_state)
    return {**(ckpt.get("metrics") or {}), "rows_from_checkpoint": matched, "rows": len(vocab)}


def load_word_vectors(model: torch.nn.Module, path: str, vocab) -> int:
    """Copy checkpoint `path`'s word-vector rows into `model`'s table, matched by word; -> rows matched.

    Only the table: the attention blocks and the head keep their fresh initialisation, so runs with
    different seeds over one table are independent models that can share it (see `--freeze-words`).
    """
    ckpt = load_checkpoint(path)
    table = _encoder_state(ckpt)["embed.weight"]
    own = model.encoder.embed.weight
    if table.shape[1] != own.shape[1]:
        raise ValueError(f"{path}: --init-words table is {table.shape[1]}-d, this run's {own.shape[1]}-d")
    rows, matched = _rows_by_word(table, ckpt["vocab"], own.detach(), vocab.itos, f"{path}: --init-words")
    with torch.no_grad():
        own.copy_(rows)
    return matched


def _encoder_state(ckpt: dict) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a checkpoint, named as in a DiSANEncoder (a task model's without
    its `encoder.` prefix; a distilled encoder's as they are)."""
    prefix = "" if ckpt["config"].get("task") == "encoder" else "encoder."
    return {k[len(prefix):]: v for k, v in ckpt["model_state"].items() if k.startswith(prefix)}


def _rows_by_word(table: torch.Tensor, words: list[str], own: torch.Tensor, own_words: list[str],
                  what: str) -> tuple[torch.Tensor, int]:
    """`own` with each row whose word is in `words` replaced by `table`'s row for it; and how many.
    Raises ValueError (naming `what`) when no word but PAD and UNK is shared."""
    index = {word: i for i, word in enumerate(words)}
    pairs = [(i, index[word]) for i, word in enumerate(own_words) if word in index]
    if len(pairs) <= UNK + 1:  # PAD and UNK alone
        raise ValueError(f"{what} checkpoint shares no word with this run's vocab")
    out = own.clone()
    dst = torch.tensor([d for d, _ in pairs])
    src = torch.tensor([s for _, s in pairs])
    out[dst] = table[src].to(out.dtype)
    return out, len(pairs)
