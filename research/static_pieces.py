"""The student's starting point alone: the mean of its piece table's rows (each piece's teacher
vector read alone, PCA-reduced; see `disan.distill.student.piece_vectors`), scored on the staged
dev sets like any encoder. It says how much a piece student owes to its start and how much to the
DiSAN blocks trained over it.

    python -m research.static_pieces --table RUN/pieces.npy --data ../shared/data --out R.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from disan.data.sts import sts_scores
from disan.distill.teacher import teacher_tokenizer_file
from disan.eval.retrieval import evaluate_set, load_set
from disan.text.pieces import PieceTokenizer


def static_encoder(table: np.ndarray, tok: PieceTokenizer):
    def encode(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), table.shape[1]), np.float32)
        for start in range(0, len(texts), 4096):
            for i, ids in enumerate(tok.batch_ids(texts[start:start + 4096])):
                if ids:
                    out[start + i] = table[ids].mean(0)
        return out

    return encode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    encode = static_encoder(np.load(args.table), PieceTokenizer.from_file(teacher_tokenizer_file()))
    report = {"sts": sts_scores(encode, args.data, by_genre=True), "retrieval": {}}
    for name in ("scifact", "cranfield"):
        report["retrieval"][name] = evaluate_set(load_set(args.data / "retrieval" / name), encode)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
