"""Checkpoint save/load. Loading uses `torch.load(weights_only=True)`: no pickle code runs.

A checkpoint is a plain dict of tensors and JSON-like values:
    format, version, model_state, config (DiSANConfig dict), vocab (list of words), labels,
    train_config, step, epoch, metrics, and optionally optimizer_state (for --resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from disan.bundle.manifest import sha256_file
from disan.embed.shards import atomic_write
from disan.model import DiSANConfig, build_model
from disan.text.pieces import PieceTokenizer
from disan.text.tokenizer import Vocab

CHECKPOINT_FORMAT = "disan-checkpoint"
CHECKPOINT_VERSION = 1
# Where a checkpoint came from: rebuilt from a bundle's graphs (`model_export.recover`), given words
# by `disan extend-vocab`, widened by `disan widen`, given an encoder's words by `disan borrow-words`,
# trained further from another checkpoint (`disan pretrain --init-from`), or given a whitened head
# (`research.whiten_head`).
PROVENANCE_KEYS = ("recovered_from", "vocab_extension", "widening", "borrowing", "init_from", "ensemble",
                   "calibration", "merge", "whitened")
# The state only `--resume` reads (`disan pretrain`'s student and optimizer, `disan train`'s
# optimizer, trainer, RNG and weight average): what `disan distill merge` and a slim checkpoint
# (`python -m research slim`) drop. Everything else is kept, since readers rely on more than the
# weights: `unknown_rows` says how the vocabulary reads an unknown word, `init_from` /
# `recovered_from` where the weights came from. A list of what to keep once dropped
# `unknown_rows`, so a student carried to a GPU trained without its hashed rows.
RESUME_STATE = ("student_state", "optimizer_state", "trainer_state", "rng_state", "ema_state")


def save_checkpoint(path: str | Path, model: torch.nn.Module, vocab: Vocab | PieceTokenizer,
                    labels: list[str], **extra: Any) -> None:
    """Write `model` (its config is `model.cfg`), vocab and labels plus `extra` fields atomically; a
    model that reads subword pieces carries its tokenizer.json instead of a word list."""
    if isinstance(vocab, PieceTokenizer):
        words: dict[str, Any] = {"vocab": [], "tokenizer": vocab.to_str()}
    else:
        words = {"vocab": vocab.itos, **({"unknown_rows": vocab.unknown_rows} if vocab.unknown_rows else {})}
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model_state": model.state_dict(),
        "config": model.cfg.to_dict(),
        **words,
        "labels": list(labels),
        **extra,
    }
    write_checkpoint(path, payload)


def write_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write a checkpoint dict as it is, atomically: a crash mid-write never leaves a truncated
    checkpoint behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: torch.save(payload, fh))


def provenance(path: str | Path, payload: dict[str, Any]) -> dict[str, Any]:
    """How a file made from the checkpoint at `path` names it: file name and sha256 (never a path),
    with the provenance the checkpoint carries itself, so a chain of phases stays traceable."""
    entry: dict[str, Any] = {"file": Path(path).name, "sha256": sha256_file(path)}
    for key in PROVENANCE_KEYS:
        if payload.get(key):
            entry[key] = payload[key]
    return entry


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint dict safely; raise ValueError with the path if it is not one of ours."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: checkpoint not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt / foreign files
        # The first line names the problem; torch's own advice on weights_only follows on later ones.
        first = next(iter(str(exc).splitlines()), "")
        raise ValueError(f"{path}: cannot read checkpoint ({exc.__class__.__name__}: {first})") from exc
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a disan checkpoint")
    return payload


def model_from_checkpoint(payload: dict[str, Any]
                          ) -> tuple[torch.nn.Module, Vocab | PieceTokenizer, list[str]]:
    """Rebuild the model (eval mode), vocab and labels from a loaded checkpoint dict."""
    cfg = DiSANConfig.from_dict(payload["config"])
    model = build_model(cfg)
    model.load_state_dict(payload["model_state"])
    model.eval()
    return model, checkpoint_vocab(payload), list(payload["labels"])


def checkpoint_vocab(payload: dict[str, Any]) -> Vocab | PieceTokenizer:
    """The vocabulary a checkpoint's model reads: its tokenizer.json's pieces if it carries one (a
    `disan distill student`), else its words with their hashed unknown rows if it has them."""
    if payload.get("tokenizer"):
        return PieceTokenizer.from_str(payload["tokenizer"])
    return Vocab(payload["vocab"][2:], unknown_rows=int(payload.get("unknown_rows", 0)))
