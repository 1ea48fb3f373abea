"""A piece student started from a trained word student: the word student's DiSAN blocks and head
over a piece table in its word table's space, written as a checkpoint that `disan distill student
--init` continues from.

    python -m research.pieces_from_words --words WORD.pt --pieces RUN/pieces.npy --corpus CORPUS \
        --out START.pt

The table: a whole-word piece ("paper") takes the word student's row for that word; every other
piece (a continuation "##ing", or a word the word table lacks) takes the ridge map, fitted on the
whole-word pieces, from its start in `pieces.npy` (the teacher's vector of the piece alone, PCA;
`disan.distill.student.rows.piece_vectors`) to the word table, scaled to the word rows' mean norm (a
regression's predictions are shrunk towards the mean). A text of common words then reads as the
word student read it; the training run teaches the blocks the split words. The checkpoint marks
the mapped rows trainable and the rest not, for `--tune rows` (only those rows learn); a run with
`--tune all` trains everything.

The head: the piece students distil into the teacher's space turned onto its principal axes
(`--rotate-teacher`, the axes of the cache rows after the validation rows), so the word student's
projection is turned by the same axes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from disan.distill.student.config import StudentConfig
from disan.distill.student.rows import principal_axes
from disan.distill.teacher import TeacherCache, teacher_tokenizer_file
from disan.model import DiSANConfig
from disan.text.pieces import PAD, PieceTokenizer
from disan.train.checkpoint import load_checkpoint, write_checkpoint


def piece_table(words: list[str], word_rows: np.ndarray, pieces: list[str], start: np.ndarray,
                ridge: float = 1e-2) -> tuple[np.ndarray, np.ndarray]:
    """([len(pieces), word dim] table, [len(pieces)] True where a row came straight from the word
    table: a whole-word piece the word table has; padding never)."""
    index = {w: i for i, w in enumerate(words)}
    direct = np.asarray([bool(i > PAD and p and not p.startswith("##") and p in index)
                         for i, p in enumerate(pieces)])
    src = np.flatnonzero(direct)
    x = np.hstack([start[src], np.ones((len(src), 1), np.float32)]).astype(np.float64)
    y = word_rows[[index[pieces[i]] for i in src]].astype(np.float64)
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * np.eye(len(gram))
    w = np.linalg.solve(gram, x.T @ y)
    mapped = np.hstack([start, np.ones((len(start), 1), np.float32)]) @ w
    mapped *= np.linalg.norm(y, axis=1).mean() / np.linalg.norm(mapped[~direct], axis=1).mean()
    table = mapped.astype(np.float32)
    table[src] = y
    table[PAD] = 0.0
    return table, direct


def turn_head(state: dict, turn: np.ndarray) -> None:
    """Turn an encoder's head (its projection to the teacher) by `turn`, in place: its vectors v
    become turn @ v."""
    turn = torch.from_numpy(np.ascontiguousarray(turn))
    state["proj.weight"] = turn @ state["proj.weight"]
    state["proj.bias"] = turn @ state["proj.bias"]


def graft(words_ckpt: dict, tok: PieceTokenizer, start: np.ndarray, axes: np.ndarray | None
          ) -> tuple[dict, int]:
    """(piece student state dict and config, rows taken from the word table)."""
    state = {k: v.clone() for k, v in words_ckpt["model_state"].items()}
    pieces = tok.pieces_by_id()
    table, direct = piece_table(words_ckpt["vocab"], state["embed.weight"].numpy(), pieces, start)
    state["embed.weight"] = torch.from_numpy(table)
    # the rows a `--tune rows` run may train: those not taken from the word table
    state["trainable_rows"] = torch.from_numpy(~direct)
    if axes is not None:
        turn_head(state, axes)
    config = DiSANConfig(**{**words_ckpt["config"], "vocab_size": len(pieces)}).to_dict()
    return {"model_state": state, "config": config}, int(direct.sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=Path, required=True, help="a word student (encoder checkpoint)")
    parser.add_argument("--pieces", type=Path, required=True, help="a piece run's pieces.npy")
    parser.add_argument("--corpus", type=Path, required=True, help="its teacher cache gives the axes")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the teacher's WordPiece)")
    parser.add_argument("--no-rotate", action="store_true", help="for runs with --no-rotate-teacher")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as exc:  # a missing or mismatched input: one line, not a traceback
        parser.error(str(exc))


def teacher_axes(corpus: Path) -> np.ndarray:
    """The axes train_student turns the teacher by: the principal axes of 50,000 cache rows after
    the validation rows."""
    val = StudentConfig.__dataclass_fields__["val_rows"].default
    cache = TeacherCache.read(corpus / "teacher-mpnet")
    return principal_axes(np.asarray(cache.vectors()[val:val + 50_000], np.float32))


def run(args: argparse.Namespace) -> int:
    words = load_checkpoint(args.words)
    if words["config"].get("proj_dim", 0) <= 0 or not words["vocab"]:
        raise ValueError(f"{args.words}: not a word student with a projection to the teacher")
    tok = PieceTokenizer.from_file(args.tokenizer or teacher_tokenizer_file())
    start = np.load(args.pieces)
    if start.ndim != 2 or len(start) != len(tok):
        raise ValueError(f"{args.pieces}: {start.shape} rows, the tokenizer has {len(tok)} (with padding)")
    axes = None if args.no_rotate else teacher_axes(args.corpus)
    made, direct = graft(words, tok, start, axes)
    write_checkpoint(args.out, {
        "format": "disan-checkpoint", "version": 1, **made, "vocab": [], "tokenizer": tok.to_str(),
        "labels": [], "train_config": {"rotate_teacher": not args.no_rotate, "grafted_from": args.words.name},
        "metrics": {}})
    print(json.dumps({"out": str(args.out), "pieces": len(tok), "from_word_rows": direct}))
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.pieces_from_words"))
