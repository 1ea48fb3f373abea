"""A piece student distilled into the turned teacher (`disan distill student`'s default
`--rotate-teacher`) given back the teacher's own coordinates: its head turned back by the same
axes, so it serves the vectors a student of the unturned teacher would.

    python -m research.turn_back STUDENT.pt --corpus CORPUS --out OUT.pt

Cosines, and so STS and retrieval, do not change. What does: any use of single coordinates. The
SentEval pair tasks (SICK-E, SICK-R) classify [u, v, |u - v|, u * v], and u * v reads coordinate by
coordinate; the word student they were measured on serves the teacher's own coordinates. Prefixes
of the turned vectors are the teacher's principal components (Matryoshka sizes); of the turned-back
ones they are not, so the checkpoint's `matryoshka_dims` are dropped and a bundle serves the full
size only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from disan.train.checkpoint import load_checkpoint, write_checkpoint
from research.pieces_from_words import teacher_axes, turn_head


def turned_back(payload: dict, axes: np.ndarray) -> dict:
    """`payload` (a student of the turned teacher) with its head turned back by `axes`."""
    trained = dict(payload.get("train_config") or {})
    if not trained.get("rotate_teacher", False):
        raise ValueError("the student was not distilled into the turned teacher (rotate_teacher is off)")
    state = dict(payload["model_state"])
    turn_head(state, axes.T)
    out = {k: v for k, v in payload.items() if k != "matryoshka_dims"}
    trained |= {"rotate_teacher": False, "turned_back": True}
    return {**out, "model_state": state, "train_config": trained}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("student", type=Path)
    parser.add_argument("--corpus", type=Path, required=True, help="its teacher cache gives the axes")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        payload = load_checkpoint(args.student)
        write_checkpoint(args.out, turned_back(payload, teacher_axes(args.corpus)))
    except (ValueError, OSError) as exc:  # a missing or mismatched input: one line, not a traceback
        parser.error(str(exc))
    print(json.dumps({"out": str(args.out), "from": args.student.name}))
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.turn_back"))
