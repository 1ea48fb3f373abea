"""The student's starting point alone: the mean of its piece table's rows (each piece's teacher
vector read alone, PCA-reduced; see `disan.distill.student.piece_vectors`), scored on the staged
dev sets like any encoder. It says how much a piece student owes to its start and how much to the
DiSAN blocks trained over it.

    python -m research.static_pieces --table RUN/pieces.npy --data ../shared/data --out R.json \
        [--probe CORPUS]

`--probe CORPUS` also fits the least-squares map from that mean to the teacher's cached vectors of
the corpus's rows (after the first 1,024, the students' validation rows) and reports its cosine to
the teacher on those 1,024: what a student's head could reach from its start alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from disan.data.sts import sts_scores
from disan.distill.corpus.build import read_corpus
from disan.distill.teacher import TeacherCache, teacher_tokenizer_file
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


def probe_cosine(encode, corpus: Path, rows: int = 40_000, val: int = 1024) -> float:
    """Held-out cosine to the teacher of a linear map (with bias) fitted from `encode`'s vectors."""
    texts, _ = read_corpus(corpus)
    cache = TeacherCache.read(corpus / "teacher-mpnet")
    rows = min(rows, cache.done)
    target = np.asarray(cache.vectors()[:rows], np.float32)
    x = np.hstack([encode(texts[:rows]), np.ones((rows, 1), np.float32)])
    w, *_ = np.linalg.lstsq(x[val:], target[val:], rcond=None)
    pred, want = x[:val] @ w, target[:val]
    return float(np.mean((pred * want).sum(1) / np.linalg.norm(pred, axis=1) / np.linalg.norm(want, axis=1)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--probe", type=Path, metavar="CORPUS", help="a corpus with its teacher cache")
    args = parser.parse_args(argv)
    encode = static_encoder(np.load(args.table), PieceTokenizer.from_file(teacher_tokenizer_file()))
    report = {"sts": sts_scores(encode, args.data, by_genre=True), "retrieval": {}}
    for name in ("scifact", "cranfield"):
        report["retrieval"][name] = evaluate_set(load_set(args.data / "retrieval" / name), encode)
    if args.probe:
        report["probe_cosine"] = probe_cosine(encode, args.probe)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
