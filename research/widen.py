"""`disan widen CKPT OUT --d-h N`: a trained sentence encoder made wider without forgetting.

A larger student learns the teacher faster per step (docs/distillation.md, "Student capacity"),
but one trained from scratch needs far more CPU-hours than a session has to catch up with the
shipped student. This grows a trained DiSAN encoder's hidden size d_h function-preservingly
(Net2WiderNet, Chen et al., ICLR 2016), so a further phase (`disan pretrain --init-from OUT`)
starts from what the student already knows, with room for more.

Every feature of DiSAN's token vectors is computed per feature from there on (the multi-dim
attention, the fusion gate and source2token all act element-wise on a feature), so feature k of
the wider model can be a copy of an old feature g(k):
  * a layer that writes a widened space takes the rows g of its weight and bias;
  * a layer that reads one takes the columns g, each divided by how many copies its old feature
    now has, so the copies' contributions add up to the old one.
With `noise` 0 the wider encoder serves the same vectors (research/tests/test_widen.py); a little noise on
the widened weight matrices lets two copies of a feature learn different things (dropout does too).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from disan.model import DiSANConfig
from disan.train.checkpoint import PROVENANCE_KEYS, load_checkpoint, provenance, write_checkpoint

# The one architecture this knows how to widen: the shipped student's (see `_check`).
_WIDENABLE = {"encoder_kind": "disan", "attention_kind": "multi_dim", "mask_kind": "directional",
              "s2t_kind": "multi_dim", "task": "encoder"}


def _check(cfg: DiSANConfig, d_h: int) -> None:
    for key, want in _WIDENABLE.items():
        if getattr(cfg, key) != want:
            raise ValueError(f"widen takes a DiSAN sentence encoder ({key} {want!r}), not {key} "
                             f"{getattr(cfg, key)!r}")
    if d_h <= cfg.d_h:
        raise ValueError(f"--d-h {d_h}: give a hidden size larger than the checkpoint's {cfg.d_h}")


def copies(old: int, new: int, rng: np.random.Generator) -> np.ndarray:
    """g: [new] old feature of each new one; the first `old` are themselves, the rest are drawn
    without repeats while they last (so copy counts differ by at most one)."""
    extra = new - old
    drawn = np.concatenate([rng.permutation(old) for _ in range(-(-extra // old))])[:extra]
    return np.concatenate([np.arange(old), drawn])


def _rows(w: Tensor, g: np.ndarray) -> Tensor:
    return w[torch.from_numpy(g)]


def _cols(w: Tensor, g: np.ndarray) -> Tensor:
    """Columns g, each divided by its old column's number of copies."""
    count = torch.from_numpy(np.bincount(g)[g]).to(w.dtype)
    return w[:, torch.from_numpy(g)] / count


def widen_state(state: dict[str, Tensor], d_old: int, d_new: int, noise: float = 0.0,
                seed: int = 0) -> dict[str, Tensor]:
    """The state dict of a DiSAN encoder with hidden size `d_new`, from one with `d_old`."""
    rng = np.random.default_rng(seed)
    out = dict(state)
    spans = {}
    for block in ("fw", "bw"):
        g = copies(d_old, d_new, rng)
        spans[block] = g
        p = f"{block}."
        out[p + "map.linear.weight"] = _rows(state[p + "map.linear.weight"], g)   # [d, d_e]
        out[p + "map.linear.bias"] = _rows(state[p + "map.linear.bias"], g)
        out[p + "b1"] = _rows(state[p + "b1"], g)
        for name in ("w1.weight", "w2.weight", "gate_s.linear.weight", "gate_h.linear.weight"):
            out[p + name] = _cols(_rows(state[p + name], g), g)                   # [d, d]
        out[p + "gate_s.linear.bias"] = _rows(state[p + "gate_s.linear.bias"], g)
    # u = [u_fw; u_bw]: the backward block's features follow the forward block's.
    u = np.concatenate([spans["fw"], spans["bw"] + d_old])                        # [2d_new] -> [2d_old]
    for name in ("s2t.map1.linear", "s2t.map2.linear"):
        out[name + ".weight"] = _cols(_rows(state[name + ".weight"], u), u)       # [2d, 2d]
        out[name + ".bias"] = _rows(state[name + ".bias"], u)
    if "proj.weight" in state:
        out["proj.weight"] = _cols(state["proj.weight"], u)                       # [proj, 2d]
    if noise > 0:  # on the widened matrices only: the word vectors and biases stay as they were
        gen = torch.Generator().manual_seed(seed)
        for name in [n for n, w in out.items() if w is not state[n] and w.ndim == 2]:
            w = out[name]
            out[name] = w + noise * w.std() * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    return out


def widen(payload: dict, d_h: int, noise: float = 0.0, seed: int = 0) -> dict:
    """A wider copy of an `encoder` checkpoint `payload` (no training state)."""
    cfg = DiSANConfig.from_dict(payload["config"])
    _check(cfg, d_h)
    state = widen_state(payload["model_state"], cfg.d_h, d_h, noise, seed)
    config = dict(payload["config"]) | {"d_h": d_h}
    dropped = ("optimizer_state", "student_state", *PROVENANCE_KEYS)
    return {k: v for k, v in payload.items() if k not in dropped} | {"config": config, "model_state": state}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a sentence encoder checkpoint (disan pretrain)")
    parser.add_argument("out", type=Path, help="where to write the wider checkpoint")
    parser.add_argument("--d-h", type=int, required=True, help="the new hidden size (paper: 300)")
    parser.add_argument("--noise", type=float, default=0.01,
                        help="std of the noise on the widened weight matrices, relative to each one's std "
                             "(0: the same vectors)")
    parser.add_argument("--seed", type=int, default=0, help="which features are copied, and the noise")


def run(args: argparse.Namespace) -> int:
    if args.noise < 0:
        raise ValueError(f"--noise {args.noise}: give a std of at least 0")
    payload = load_checkpoint(args.checkpoint)
    old = payload["config"]["d_h"]
    out = widen(payload, args.d_h, args.noise, args.seed)
    # Where the input came from moves under `widening`: this file was made, not trained.
    out["widening"] = {"d_h": [old, args.d_h], "noise": args.noise, "seed": args.seed,
                       "from": provenance(args.checkpoint, payload)}
    write_checkpoint(args.out, out)
    print(f"{args.out}: d_h {old} -> {args.d_h} (noise {args.noise}, seed {args.seed})")
    return 0
