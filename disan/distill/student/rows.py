"""The corpus as piece ids (`PieceRows`: every text's ids held flat, encoded in length-sorted parts),
the token table's start (`piece_vectors`: each piece's teacher vector alone, PCA-reduced) and the
teacher's principal axes (`principal_axes`: the turn `--rotate-teacher` distils into)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from disan.model import DiSANEncoder
from disan.text.pieces import PAD, PieceTokenizer
from disan.text.windowing import EMBEDDING_LEAD, window_starts

# With windows, a text's pieces past this many are dropped: the teacher reads at most 384 tokens
# (all-mpnet-base-v2's max_seq_length), so no target says anything about what lies beyond.
WINDOWED_TEXT_PIECES = 512


class PieceRows:
    """Piece ids of every corpus text, held flat (one int32 array and offsets), cut to `max_pieces`;
    with `windows`, a longer text is kept whole and read as the embed route reads it: in windows of
    `max_pieces`, their vectors pooled with the first window counting `EMBEDDING_LEAD` times
    (`disan.text.windowing`), so a student learns the document vectors it will serve."""

    def __init__(self, tok: PieceTokenizer, texts: list[str], max_pieces: int, chunk: int = 65536,
                 windows: bool = False):
        self.window, self.windows = max_pieces, windows
        keep = WINDOWED_TEXT_PIECES if windows else max_pieces
        parts, lengths = [], []
        for start in range(0, len(texts), chunk):
            for ids in tok.batch_ids(texts[start:start + chunk]):
                ids = ids[:keep] or [tok.unk_id or 1]
                parts.append(np.asarray(ids, np.int32))
                lengths.append(len(ids))
        self.flat = np.concatenate(parts)
        self.lengths = np.asarray(lengths, np.int32)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def batch(self, rows: np.ndarray, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return padded([self.ids(r) for r in rows], device)

    def encode(self, encoder: DiSANEncoder, rows: np.ndarray, device: str, buckets: int = 1) -> torch.Tensor:
        """`encoder`'s vectors of `rows`, in order, run as `buckets` length-sorted parts: the
        attention costs n^2 a row, so one long passage must not pad a whole batch to its length."""
        if self.windows and (self.lengths[rows] > self.window).any():
            return self.encode_windows(encoder, rows, device, buckets)
        return in_length_order(encoder, [self.ids(r) for r in rows], device, buckets)

    def encode_windows(self, encoder: DiSANEncoder, rows: np.ndarray, device: str,
                       buckets: int) -> torch.Tensor:
        """`encode` with each row cut into windows and their vectors pooled as `pool_windows` pools
        them (token-weighted, the first window's weight times the lead)."""
        pieces, owner, weight = [], [], []
        for i, r in enumerate(rows):
            ids = self.ids(r)
            for k, s in enumerate(window_starts(len(ids), self.window)):
                pieces.append(ids[s:s + self.window])
                owner.append(i)
                weight.append(min(self.window, len(ids)) * (EMBEDDING_LEAD if k == 0 else 1.0))
        vectors = in_length_order(encoder, pieces, device, buckets)
        w = torch.tensor(weight, dtype=vectors.dtype, device=vectors.device)
        at = torch.tensor(owner, device=vectors.device)
        total = torch.zeros(len(rows), dtype=vectors.dtype, device=vectors.device).index_add_(0, at, w)
        pooled = torch.zeros(len(rows), vectors.shape[1], dtype=vectors.dtype, device=vectors.device)
        return pooled.index_add_(0, at, vectors * w[:, None]) / total[:, None]

    def ids(self, row: int) -> np.ndarray:
        return self.flat[self.offsets[row]:self.offsets[row] + self.lengths[row]]

    def encode_all(self, encoder: DiSANEncoder, rows: np.ndarray, device: str, buckets: int = 1,
                   chunk: int = 256) -> torch.Tensor:
        """`encode` of any number of rows, `chunk` at a time (evaluation and the head's fit)."""
        return torch.cat([self.encode(encoder, rows[i:i + chunk], device, buckets)
                          for i in range(0, len(rows), chunk)])


def padded(pieces: list[np.ndarray], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Id lists as one [len, longest] batch of ids padded with PAD, and its mask."""
    ids = np.full((len(pieces), max(len(p) for p in pieces)), PAD, np.int64)
    for i, p in enumerate(pieces):
        ids[i, :len(p)] = p
    ids_t = torch.from_numpy(ids).to(device)
    return ids_t, ids_t != PAD


def in_length_order(encoder: DiSANEncoder, pieces: list[np.ndarray], device: str,
                    buckets: int) -> torch.Tensor:
    """`encoder`'s vectors of the id lists `pieces`, in order, run as `buckets` length-sorted parts."""
    order = np.argsort([len(p) for p in pieces], kind="stable")
    parts = [encoder(*padded([pieces[i] for i in part], device))
             for part in np.array_split(order, buckets) if len(part)]
    out = torch.cat(parts)
    return out[torch.from_numpy(np.argsort(order, kind="stable")).to(out.device)]


@torch.no_grad()
def piece_vectors(tok: PieceTokenizer, dim: int, encode, cache: Path) -> np.ndarray:
    """[len(tok), dim] start of the token table: each piece's teacher vector alone, PCA-reduced and
    scaled to unit mean norm (row 0, padding, is zero). `encode(texts) -> [N, D]` is the teacher."""
    if cache.is_file():
        table = np.load(cache)
        if table.shape == (len(tok), dim):
            return table
    words = tok.pieces_by_id()[PAD + 1:]
    texts = [w[2:] if w.startswith("##") else w for w in words]  # a continuation piece as a word
    raw = np.asarray(encode(texts), np.float32)
    raw = raw - raw.mean(0)
    _, _, vt = np.linalg.svd(raw[np.random.default_rng(0).permutation(len(raw))[:20000]],
                             full_matrices=False)
    reduced = raw @ vt[:dim].T
    reduced /= np.linalg.norm(reduced, axis=1).mean()
    table = np.zeros((len(tok), dim), np.float32)
    table[1:] = reduced
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, table)
    return table


def principal_axes(vectors: np.ndarray) -> np.ndarray:
    """[D, D] orthonormal rows, the uncentred principal axes of `vectors` by falling energy: turning
    vectors onto them keeps every cosine and puts the most of each vector first."""
    _, _, vt = np.linalg.svd(np.asarray(vectors, np.float64), full_matrices=False)
    return vt.astype(np.float32)
