"""`disan slim CKPT OUT`: a checkpoint without its training state, its floats in fp16; `disan slim
TEACHER_DIR OUT_DIR`: a sentence-transformers folder (the teacher) with its weights in fp16.

A student trained on a remote GPU has to come back through small files: `last.pt` carries the
optimizer's moments and a second copy of the weights, and `best.pt` stores its word-vector table
in fp32. The slim copy keeps what export, `disan eval --checkpoint` and `disan pretrain
--init-from` read (the model's state, config, vocabulary, labels and the training record) and
drops the rest. Loading casts the fp16 tensors back to the model's fp32 (`load_state_dict`
copies across dtypes), so every reader of checkpoints takes it unchanged. It cannot `--resume`
a run: that needs the optimizer's state, which is what is dropped.

The teacher's folder is halved for the same trip the other way (all-mpnet-base-v2: 438 MB of
fp32 weights). transformers loads the fp16 file as an fp16 model, which suits a GPU; on a CPU,
`.float()` it first (fp16 matmuls are slow there).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from disan.optional import require
from disan.train.checkpoint import RESUME_STATE as DROPPED  # what a slim checkpoint drops
from disan.train.checkpoint import load_checkpoint, write_checkpoint

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _cast(tensors: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """The floating-point tensors in `dtype`, the others (ids, masks) as they are."""
    return {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in tensors.items()}


def slim_checkpoint(src: Path, dst: Path, dtype: str = "fp16") -> dict:
    """Write `src`'s slim copy to `dst` (atomically); returns both sizes in bytes."""
    if src.resolve() == dst.resolve():
        raise ValueError(f"{dst} is the checkpoint itself; name another file")
    payload = load_checkpoint(src)
    slim = {k: v for k, v in payload.items() if k not in DROPPED}
    slim |= {"model_state": _cast(payload["model_state"], dtype),
             "slimmed_from": {"file": src.name, "dtype": dtype}}
    write_checkpoint(dst, slim)
    return {"bytes_in": src.stat().st_size, "bytes_out": dst.stat().st_size}


def slim_teacher(src: Path, dst: Path, dtype: str = "fp16") -> dict:
    """Copy the sentence-transformers folder `src` to the new folder `dst`, its
    `model.safetensors` tensors cast to `dtype`; returns both weight files' sizes in bytes."""
    st = require("safetensors.torch", "minilm")  # with sentence-transformers (minilm / mpnet extras)
    load_file, save_file = st.load_file, st.save_file

    weights = src / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{src}: no model.safetensors (not a sentence-transformers folder)")
    if dst.exists():
        raise ValueError(f"{dst} exists; name a new folder")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = {k: v.contiguous() for k, v in _cast(load_file(weights), dtype).items()}
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return {"bytes_in": weights.stat().st_size, "bytes_out": (dst / "model.safetensors").stat().st_size}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a disan checkpoint (best.pt, last.pt, ...) or "
                        "a sentence-transformers folder (a teacher)")
    parser.add_argument("out", type=Path, help="where to write the slim copy (a new folder for a teacher)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16",
                        help="storage type of the model's floating-point tensors")


def run(args: argparse.Namespace) -> int:
    slim = slim_teacher if args.checkpoint.is_dir() else slim_checkpoint
    sizes = slim(args.checkpoint, args.out, args.dtype)
    print(f"{args.out}: {sizes['bytes_out'] / 1e6:.1f} MB (from {sizes['bytes_in'] / 1e6:.1f} MB)")
    return 0
