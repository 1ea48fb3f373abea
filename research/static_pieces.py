"""The student's starting point alone: the mean of its piece table's rows (each piece's teacher
vector read alone, PCA-reduced; see `disan.distill.student.piece_vectors`), scored on the staged
dev sets like any encoder. It says how much a piece student owes to its start and how much to the
DiSAN blocks trained over it.

    python -m research.static_pieces --table RUN/pieces.npy --data ../shared/data --out R.json \
        [--probe CORPUS] [--train CORPUS --save-table OUT.npy]

`--probe CORPUS` also fits the least-squares map from that mean to the teacher's cached vectors of
the corpus's rows (after the first 1,024, the students' validation rows) and reports its cosine to
the teacher on those 1,024: what a student's head could reach from its start alone.

`--train CORPUS` first distils the table itself: the mean of its rows, then a linear map (starting
as that least-squares map), trained on the same rows for `--epochs` (1 - cosine to the teacher),
as static-embedding distillation does; the scores are then the trained encoder's, with its
held-out cosine after each epoch. `--save-table` writes the trained table in pieces.npy's layout,
a start for `disan distill student` (RUN/pieces.npy, or pack-student.sh's PIECES.npy). A missing
`--table` is computed with the teacher first (`piece_vectors`, `--dim` wide) and written there.
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


def cosine(pred: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean((pred * want).sum(1) / np.linalg.norm(pred, axis=1) / np.linalg.norm(want, axis=1)))


def least_squares(x: np.ndarray, target: np.ndarray, val: int) -> np.ndarray:
    """[d + 1, D] map (the last row the bias) fitted on the rows after the first `val`."""
    x = np.hstack([x, np.ones((len(x), 1), np.float32)])
    w, *_ = np.linalg.lstsq(x[val:], target[val:], rcond=None)
    return w


def probe_cosine(encode, corpus: Path, rows: int = 40_000, val: int = 1024) -> float:
    """Held-out cosine to the teacher of a linear map (with bias) fitted from `encode`'s vectors."""
    texts, _ = read_corpus(corpus)
    cache = TeacherCache.read(corpus / "teacher-mpnet")
    rows = min(rows, cache.done)
    target = np.asarray(cache.vectors()[:rows], np.float32)
    x = encode(texts[:rows])
    w = least_squares(x, target, val)
    return cosine(x[:val] @ w[:-1] + w[-1], target[:val])


def train_static(table: np.ndarray, tok: PieceTokenizer, corpus: Path, epochs: int = 8, lr: float = 2e-3,
                 batch_size: int = 256, val: int = 1024, max_pieces: int = 64, seed: int = 0,
                 log=print) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The table and its linear map (the least-squares map of the start, then 1 - cosine to the
    teacher's cached vectors of the corpus rows after the first `val`); returns the trained table,
    the map [d + 1, D] (the last row the bias) and the held-out cosine at the start and after each
    epoch. Row 0 (padding) stays zero."""
    import torch  # the train extra: scoring a table needs numpy alone
    import torch.nn.functional as F

    torch.manual_seed(seed)
    texts, _ = read_corpus(corpus)
    cache = TeacherCache.read(corpus / "teacher-mpnet")
    rows = cache.done
    target = np.asarray(cache.vectors()[:rows], np.float32)
    ids = [x[:max_pieces] or [tok.unk_id or 1] for x in tok.batch_ids(texts[:rows])]
    flat = torch.tensor([i for x in ids for i in x])
    starts = torch.tensor(np.concatenate([[0], np.cumsum([len(x) for x in ids])]))
    w = least_squares(static_encoder(table, tok)(texts[:min(rows, 40_000)]), target[:40_000], val)
    weights = torch.nn.Parameter(torch.from_numpy(table.astype(np.float32)))
    head = torch.nn.Linear(table.shape[1], target.shape[1])
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(w[:-1].T))
        head.bias.copy_(torch.from_numpy(w[-1]))
    optimizer = torch.optim.Adam([weights, *head.parameters()], lr=lr)
    want = torch.from_numpy(target)

    def encode(chosen: np.ndarray):
        parts = [flat[starts[r]:starts[r + 1]] for r in chosen]
        offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(p) for p in parts])[:-1]]))
        return head(F.embedding_bag(torch.cat(parts), weights, offsets, mode="mean"))

    def held_out() -> float:
        with torch.no_grad():
            return F.cosine_similarity(encode(np.arange(val)), want[:val]).mean().item()

    history = [held_out()]
    log(f"start: held-out cosine {history[-1]:.4f}")
    rng = np.random.default_rng(seed)
    train = np.arange(val, rows)
    for epoch in range(epochs):
        for batch in np.array_split(rng.permutation(train), max(1, len(train) // batch_size)):
            loss = 1 - F.cosine_similarity(encode(batch), want[batch]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                weights[0].zero_()  # padding
        history.append(held_out())
        log(f"epoch {epoch + 1}: held-out cosine {history[-1]:.4f}")
    trained = np.vstack([head.weight.detach().numpy().T, head.bias.detach().numpy()[None]])
    return weights.detach().numpy(), trained, history


def mapped_encoder(table: np.ndarray, tok: PieceTokenizer, w: np.ndarray):
    """The static encoder through its linear map [d + 1, D] (`train_static`)."""
    mean = static_encoder(table, tok)

    def encode(texts: list[str]) -> np.ndarray:
        return mean(texts) @ w[:-1] + w[-1]

    return encode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--dim", type=int, default=300, help="a missing --table's width")
    parser.add_argument("--data", type=Path, help="staged data: score on the dev sets")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--probe", type=Path, metavar="CORPUS", help="a corpus with its teacher cache")
    parser.add_argument("--train", type=Path, metavar="CORPUS", help="distil the table on this corpus first")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-table", type=Path, metavar="OUT.npy")
    args = parser.parse_args(argv)
    if args.save_table and not args.train:
        parser.error("--save-table writes the trained table: it needs --train CORPUS")
    tok = PieceTokenizer.from_file(teacher_tokenizer_file())
    if not args.table.is_file():
        from disan.distill.student import piece_vectors  # torch (`train`): only to build a start
        from disan.distill.teacher import sentence_transformer_encoder

        piece_vectors(tok, args.dim, sentence_transformer_encoder("mpnet", batch_size=256), args.table)
    table = np.load(args.table).astype(np.float32)
    encode = static_encoder(table, tok)
    report: dict = {}
    if args.train:
        table, w, history = train_static(table, tok, args.train, args.epochs, args.lr, seed=args.seed)
        report["train"] = {"corpus": str(args.train), "epochs": args.epochs, "lr": args.lr, "seed": args.seed,
                           "held_out_cosine": [round(c, 4) for c in history]}
        encode = mapped_encoder(table, tok, w)
        if args.save_table:
            np.save(args.save_table, table)
    if args.data:
        report["sts"] = sts_scores(encode, args.data, by_genre=True)
        report["retrieval"] = {name: evaluate_set(load_set(args.data / "retrieval" / name), encode)
                               for name in ("scifact", "cranfield")}
    if args.probe:
        report["probe_cosine"] = probe_cosine(encode, args.probe)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
