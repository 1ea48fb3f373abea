"""The corpus as piece ids (`PieceRows`: every text's ids held flat, encoded in length-sorted parts),
the token table's start (`piece_vectors`: each piece's teacher vector alone, PCA-reduced) and the
teacher's principal axes (`principal_axes`: the turn `--rotate-teacher` distils into)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from disan.model import DiSANEncoder
from disan.text.pieces import PAD, PieceTokenizer


class PieceRows:
    """Piece ids of every corpus text, held flat (one int32 array and offsets), cut to `max_pieces`."""

    def __init__(self, tok: PieceTokenizer, texts: list[str], max_pieces: int, chunk: int = 65536):
        parts, lengths = [], []
        for start in range(0, len(texts), chunk):
            for ids in tok.batch_ids(texts[start:start + chunk]):
                ids = ids[:max_pieces] or [tok.unk_id or 1]
                parts.append(np.asarray(ids, np.int32))
                lengths.append(len(ids))
        self.flat = np.concatenate(parts)
        self.lengths = np.asarray(lengths, np.int32)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def batch(self, rows: np.ndarray, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        width = int(self.lengths[rows].max())
        ids = np.full((len(rows), width), PAD, np.int64)
        for i, r in enumerate(rows):
            ids[i, :self.lengths[r]] = self.flat[self.offsets[r]:self.offsets[r] + self.lengths[r]]
        ids_t = torch.from_numpy(ids).to(device)
        return ids_t, ids_t != PAD

    def encode(self, encoder: DiSANEncoder, rows: np.ndarray, device: str, buckets: int = 1) -> torch.Tensor:
        """`encoder`'s vectors of `rows`, in order, run as `buckets` length-sorted parts: the
        attention costs n^2 a row, so one long passage must not pad a whole batch to its length."""
        order = np.argsort(self.lengths[rows], kind="stable")
        parts = [encoder(*self.batch(rows[part], device))
                 for part in np.array_split(order, buckets) if len(part)]
        out = torch.cat(parts)
        return out[torch.from_numpy(np.argsort(order, kind="stable")).to(out.device)]

    def encode_all(self, encoder: DiSANEncoder, rows: np.ndarray, device: str, buckets: int = 1,
                   chunk: int = 256) -> torch.Tensor:
        """`encode` of any number of rows, `chunk` at a time (evaluation and the head's fit)."""
        return torch.cat([self.encode(encoder, rows[i:i + chunk], device, buckets)
                          for i in range(0, len(rows), chunk)])


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
