"""`disan slim CKPT OUT`: a checkpoint without its training state, its floats in fp16; `disan slim
TEACHER_DIR OUT_DIR`: a sentence-transformers folder (the teacher) with its weights in fp16.

A student trained on a remote GPU has to come back through small files: `last.pt` carries the
optimizer's moments and a second copy of the weights, and `best.pt` stores its word-vector table
in fp32. The slim copy keeps what export, `disan eval --checkpoint` and `disan pretrain
--init-from` read (the model's state, config, vocabulary, labels and the training record) and
drops the rest. Loading casts the fp16 tensors back to the model's fp32 (`load_state_dict`
copies across dtypes), so every reader of checkpoints takes it unchanged. It cannot `--resume`
a run: that needs the optimizer's state, which is what is dropped.

A student that reads whole words through a borrowed word table (`disan distill whole-words`)
never trains that table, and in fp16 it is 112 MB of the way back. `--without-borrowed` leaves it
out and records its fingerprint. Here, `--borrowed-from START.pt` puts the start's table back,
after checking that it is the same table the student trained with.

The teacher's folder is halved for the same trip the other way (all-mpnet-base-v2: 438 MB of
fp32 weights). transformers loads the fp16 file as an fp16 model, which suits a GPU; on a CPU,
`.float()` it first (fp16 matmuls are slow there).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path

import torch

from disan.model import BORROWED_KEY
from disan.optional import require
from disan.train.checkpoint import RESUME_STATE as DROPPED  # what a slim checkpoint drops
from disan.train.checkpoint import load_checkpoint, write_checkpoint

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _cast(tensors: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """The floating-point tensors in `dtype`, the others (ids, masks) as they are."""
    return {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in tensors.items()}


LEFT_OUT = "borrowed_left_out"  # the record of a table `--without-borrowed` left out


def _borrowed_key(state: dict[str, torch.Tensor]) -> str | None:
    """The key of the borrowed word table in a model state (an encoder's own buffer, or a task
    model's `BORROWED_KEY`), or None."""
    return next((k for k in (BORROWED_KEY.split(".")[-1], BORROWED_KEY) if k in state), None)


def _fingerprint(table: torch.Tensor) -> str:
    """The sha256 of the table's values in fp16: the same for the fp32 start and its fp16 copy."""
    return hashlib.sha256(table.to(torch.float16).contiguous().numpy().tobytes()).hexdigest()


def _put_back(slim: dict, start: Path) -> None:
    """Put the borrowed table of the checkpoint `start` back into `slim`, which left it out."""
    record = slim.pop(LEFT_OUT, None)
    if record is None:
        raise ValueError("the checkpoint left no borrowed table out; nothing to put back")
    state = load_checkpoint(start)["model_state"]
    key = _borrowed_key(state)
    if key is None:
        raise ValueError(f"{start}: reads no borrowed word table")
    table = state[key]
    if list(table.shape) != record["shape"] or _fingerprint(table) != record["sha256_fp16"]:
        raise ValueError(f"{start}: its borrowed table {list(table.shape)} is not the one the student "
                         f"trained with {record['shape']}; give that run's --init")
    slim["model_state"][record["key"]] = table


def slim_checkpoint(src: Path, dst: Path, dtype: str = "fp16", *, without_borrowed: bool = False,
                    borrowed_from: Path | None = None) -> dict:
    """Write `src`'s slim copy to `dst` (atomically); returns both sizes in bytes.

    `without_borrowed` leaves out the borrowed word table, if the model reads one, and records it.
    `borrowed_from` puts back the table that such a copy left out, from the run's start."""
    if src.resolve() == dst.resolve():
        raise ValueError(f"{dst} is the checkpoint itself; name another file")
    payload = load_checkpoint(src)
    slim = {k: v for k, v in payload.items() if k not in DROPPED}
    state = dict(payload["model_state"])
    key = _borrowed_key(state)
    if without_borrowed and key is not None:
        table = state.pop(key)
        slim[LEFT_OUT] = {"key": key, "shape": list(table.shape), "sha256_fp16": _fingerprint(table)}
    slim["model_state"] = state
    if borrowed_from is not None:
        _put_back(slim, borrowed_from)
    slim |= {"model_state": _cast(slim["model_state"], dtype),
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
    table = parser.add_mutually_exclusive_group()
    table.add_argument("--without-borrowed", action="store_true",
                       help="leave out the borrowed word table (never trained), if the model reads one")
    table.add_argument("--borrowed-from", type=Path, metavar="START",
                       help="put back the borrowed table a --without-borrowed copy left out, from the "
                       "run's --init checkpoint")


def run(args: argparse.Namespace) -> int:
    if args.checkpoint.is_dir():
        if args.without_borrowed or args.borrowed_from is not None:
            raise ValueError(f"{args.checkpoint}: a teacher folder has no borrowed word table; "
                             "--without-borrowed and --borrowed-from take a checkpoint")
        sizes = slim_teacher(args.checkpoint, args.out, args.dtype)
    else:
        sizes = slim_checkpoint(args.checkpoint, args.out, args.dtype,
                                without_borrowed=args.without_borrowed, borrowed_from=args.borrowed_from)
    print(f"{args.out}: {sizes['bytes_out'] / 1e6:.1f} MB (from {sizes['bytes_in'] / 1e6:.1f} MB)")
    return 0
