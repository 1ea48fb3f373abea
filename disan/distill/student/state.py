"""What a student run writes: `student.pt` (`save_student`: an encoder checkpoint that carries its
tokenizer.json) and `state.pt` (`save_state`, `resume_state`: what `--resume` needs, refused under
other `STATE_KEYS` flags)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from disan.distill.student.config import StudentConfig
from disan.distill.supervision import StudentLabels
from disan.model import DiSANEncoder
from disan.text.pieces import PieceTokenizer
from disan.train.checkpoint import write_checkpoint

STATE_KEYS = ("embed_dim", "d_h", "proj_dim", "keep_prob", "dims", "max_pieces", "batch_size", "pairs_batch",
              "steps", "lr", "warmup_steps", "head_lr_scale", "rotate_teacher", "tune", "anchor", "seed",
              "scored_weight", "sentiment_weight", "labels_batch", "whiten_targets", "nli_weight",
              "nli_classes_weight", "table_lr_scale", "layers", "windows")


def save_state(cfg: StudentConfig, step: int, encoder: DiSANEncoder, optimizer, schedule,
               rng: np.random.Generator, labels: StudentLabels | None = None) -> None:
    """What `--resume` needs to go on where this step left off, written beside student.pt."""
    state = {"step": step, "model": encoder.state_dict(), "labels_head": labels.state() if labels else None,
             "optimizer": optimizer.state_dict(),
             "schedule": schedule.state_dict(), "rng": rng.bit_generator.state,
             "torch_rng": torch.get_rng_state(), "config": {k: getattr(cfg, k) for k in STATE_KEYS}}
    tmp = cfg.out / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(cfg.out / "state.pt")


def resume_state(cfg: StudentConfig, encoder: DiSANEncoder, optimizer, schedule,
                 labels: StudentLabels | None = None) -> tuple[int, np.random.Generator]:
    """(first step, sampler) of a resumed run; refuses a state written with other flags."""
    path = cfg.out / "state.pt"
    if not path.is_file():
        raise ValueError(f"--resume: {path} not found (no evaluation step was reached)")
    state = torch.load(path, map_location=cfg.device, weights_only=False)
    asked = {k: getattr(cfg, k) for k in STATE_KEYS}
    fields = StudentConfig.__dataclass_fields__  # a key newer than the state: its default then
    changed = sorted(k for k in STATE_KEYS if state["config"].get(k, fields[k].default) != asked[k])
    if changed:
        raise ValueError(f"--resume: {path} was written with other {', '.join(changed)}")
    encoder.load_state_dict(state["model"])
    if labels is not None:
        labels.load_state(state.get("labels_head"))
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    torch.set_rng_state(state["torch_rng"])
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    return state["step"] + 1, rng


def save_student(path: Path, encoder: DiSANEncoder, tok: PieceTokenizer, cfg: StudentConfig, corpus: dict,
                 metrics: dict, extra: dict | None = None) -> None:
    """An `encoder` checkpoint whose vocabulary is a tokenizer.json (no word list), with `extra`
    fields beside it."""
    write_checkpoint(path, {
        "format": "disan-checkpoint", "version": 1, "model_state": encoder.state_dict(),
        "config": encoder.cfg.to_dict(), "vocab": [], "tokenizer": tok.to_str(), "labels": [],
        "train_config": {k: v for k, v in asdict(cfg).items() if not isinstance(v, Path)},
        "corpus_sha256": corpus["sha256"], "metrics": metrics, "matryoshka_dims": list(cfg.dims),
        **(extra or {})})
