"""The student's starting point alone: the mean of its piece table's rows (each piece's teacher
vector read alone, PCA-reduced; see `disan.distill.student.rows.piece_vectors`), scored on the staged
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
held-out cosine after each epoch (`--device cuda` on a lent GPU). `--save-table` writes the table
of the best held-out epoch in pieces.npy's layout, a start for `disan distill student`
(RUN/pieces.npy, or pack-student.sh's PIECES.npy), and `--save-map` its linear map [d + 1, D]
(`mapped_encoder` scores the pair elsewhere). A missing
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
                 device: str = "cpu", pairs_weight: float = 0.0, scale: float = 20.0,
                 whiten_power: float = 0.0, log=print) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The table and its linear map (the least-squares map of the start, then 1 - cosine to the
    teacher's cached vectors of the corpus rows after the first `val`); returns the table and map
    [d + 1, D] (the last row the bias) of the epoch best on the held-out rows, and the held-out
    cosine at the start and after each epoch. Row 0 (padding) stays zero.

    `pairs_weight` adds MultipleNegativesRanking on the corpus's (short, long) pairs, a batch of
    them a step (in-batch negatives, cosine x `scale`), as `disan distill student` does; 512
    pairs are held out and their retrieval accuracy logged. With pairs, the last epoch comes
    back: the cosine to the teacher no longer says which epoch is best.

    `whiten_power` P > 0 distils the teacher's vectors in its principal coordinates (centred, from
    the training rows), each scaled by its singular value^-P: the quiet directions, which a
    cosine to the raw vector all but ignores, weigh as much as the loud ones at P = 1; the
    encoder then serves vectors in those coordinates."""
    import torch  # the train extra: scoring a table needs numpy alone
    import torch.nn.functional as F

    from research.whiten_head import whitening  # torch, as this function

    torch.manual_seed(seed)
    texts, _ = read_corpus(corpus)
    cache = TeacherCache.read(corpus / "teacher-mpnet")
    rows = cache.done
    target = np.asarray(cache.vectors()[:rows], np.float32)
    if whiten_power > 0:
        mean, linear = whitening(target[val:val + 40_000], whiten_power, target.shape[1], centre=True)
        target = ((target - mean) @ linear.T).astype(np.float32)
    ids = tok.encode(texts[:rows], max_pieces).ids  # 0-padded: embedding_bag's mean skips padding
    w = least_squares(static_encoder(table, tok)(texts[:min(rows, 40_000)]), target[:40_000], val)
    weights = torch.nn.Parameter(torch.from_numpy(table.astype(np.float32)).to(device))
    head = torch.nn.Linear(table.shape[1], target.shape[1]).to(device)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(w[:-1].T))
        head.bias.copy_(torch.from_numpy(w[-1]))
    optimizer = torch.optim.Adam([weights, *head.parameters()], lr=lr)
    want, ids = torch.from_numpy(target).to(device), torch.from_numpy(ids).to(device)
    rng = np.random.default_rng(seed)
    if pairs_weight > 0:
        pairs = np.load(corpus / "pairs.npy")[:, :2]
        pairs = pairs[rng.permutation(len(pairs))]
        texts_of_pairs, at = np.unique(pairs.ravel(), return_inverse=True)
        pair_ids = torch.from_numpy(tok.encode([texts[i] for i in texts_of_pairs], max_pieces).ids).to(device)
        at = at.reshape(-1, 2)
        val_pairs, train_pairs = at[:512], at[512:]

    def encode_ids(chosen_ids):
        return head(F.embedding_bag(chosen_ids, weights, mode="mean", padding_idx=0))

    def held_out() -> float:
        with torch.no_grad():
            cos = F.cosine_similarity(encode_ids(ids[:val]), want[:val]).mean().item()
            if pairs_weight > 0:
                q, p = (F.normalize(encode_ids(pair_ids[val_pairs[:, k]]), dim=-1) for k in (0, 1))
                hit = (q @ p.T).argmax(1).cpu().numpy() == np.arange(len(q))
                log(f"held-out pair accuracy {hit.mean():.4f}")
            return cos

    def snapshot() -> tuple[np.ndarray, np.ndarray]:
        return (weights.detach().cpu().numpy().copy(),
                np.vstack([head.weight.detach().cpu().numpy().T, head.bias.detach().cpu().numpy()[None]]))

    history = [held_out()]
    best = snapshot()
    log(f"start: held-out cosine {history[-1]:.4f}")
    train = np.arange(val, rows)
    for epoch in range(epochs):
        for batch in np.array_split(rng.permutation(train), max(1, len(train) // batch_size)):
            batch = torch.from_numpy(batch).to(device)
            loss = 1 - F.cosine_similarity(encode_ids(ids[batch]), want[batch]).mean()
            if pairs_weight > 0:
                chosen = train_pairs[rng.integers(0, len(train_pairs), batch_size)]
                q, p = (F.normalize(encode_ids(pair_ids[chosen[:, k]]), dim=-1) for k in (0, 1))
                right = torch.arange(len(q), device=q.device)
                loss = loss + pairs_weight * F.cross_entropy(scale * q @ p.T, right)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                weights[0].zero_()  # padding
        history.append(held_out())
        log(f"epoch {epoch + 1}: held-out cosine {history[-1]:.4f}")
        if pairs_weight > 0 or history[-1] >= max(history[:-1]):
            best = snapshot()
    return *best, history


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
    parser.add_argument("--device", default="cpu", help="where --train runs (cuda on a lent GPU)")
    parser.add_argument("--whiten-power", type=float, default=0.0,
                        help="--train: distil the teacher in its principal coordinates scaled by s^-P")
    parser.add_argument("--pairs-weight", type=float, default=0.0,
                        help="--train: MultipleNegativesRanking on the corpus's pairs at this weight")
    parser.add_argument("--save-table", type=Path, metavar="OUT.npy")
    parser.add_argument("--save-map", type=Path, metavar="MAP.npy")
    args = parser.parse_args(argv)
    if (args.save_table or args.save_map) and not args.train:
        parser.error("--save-table or --save-map writes the trained encoder: it needs --train CORPUS")
    tok = PieceTokenizer.from_file(teacher_tokenizer_file())
    if not args.table.is_file():
        from disan.distill.student.rows import piece_vectors  # torch (`train`): only to build a start
        from disan.distill.teacher import sentence_transformer_encoder

        piece_vectors(tok, args.dim, sentence_transformer_encoder("mpnet", batch_size=256), args.table)
    table = np.load(args.table).astype(np.float32)
    encode = static_encoder(table, tok)
    report: dict = {}
    if args.train:
        table, w, history = train_static(table, tok, args.train, args.epochs, args.lr, seed=args.seed,
                                         device=args.device, pairs_weight=args.pairs_weight,
                                         whiten_power=args.whiten_power)
        report["train"] = {"corpus": str(args.train), "epochs": args.epochs, "lr": args.lr, "seed": args.seed,
                           "pairs_weight": args.pairs_weight, "whiten_power": args.whiten_power,
                           "held_out_cosine": [round(c, 4) for c in history]}
        encode = mapped_encoder(table, tok, w)
        if args.save_table:
            np.save(args.save_table, table)
        if args.save_map:
            np.save(args.save_map, w)
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
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.static_pieces"))
