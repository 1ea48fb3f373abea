"""Sparse lexical vectors of a bundle's embed route (TORCH-FREE: numpy): hybrid search's other half.

A dense vector keeps what a text means and loses which rare words it used: "curcumin" in a query
and in a document is the exact match a bag of words keeps. A bundle with a lexical table serves,
beside each dense vector, a sparse one over the ids its embed tokenizer gives (whole words and
pieces, every window of a long text): each distinct id weighs `idf[id] * (1 + ln count)`, and the
vector has unit length. The dot product of two of them is their lexical cosine, so a hybrid score
is `(1 - w) * dense cosine + w * sparse dot` (TEI's `POST /embed_sparse`, `Encoder.encode_sparse`,
`disan eval --retrieval --hybrid W`, `hybrid` of `/similarity` and `Encoder.similarity`).

The IDF comes from a general corpus (`python -m model_export.lexical`), never from the user's
documents, and is stored as a few levels (`lexical.npz`, `levels` uint8 x `scale`): ids the corpus
never held get the top level. The manifest names the file (`lexical`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.manifest import BundleError

LEXICAL_FILE = "lexical.npz"
SparseVector = tuple[np.ndarray, np.ndarray]  # (indices int64 ascending, values float32)
WEIGHTING = "idf x (1 + ln count) per distinct token id, unit length"
# What every refusal of a bundle without a table says after the bundle's name (Encoder, service, eval, embed)
NO_TABLE = "has no lexical table (python -m model_export.lexical)"


def lexical_entry(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's `lexical` ({"file", "scale", ...}) or None."""
    entry = manifest.get("lexical")
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) \
            or not isinstance(entry.get("scale"), (int, float)):
        raise BundleError(f"lexical must be an object naming its file and scale, got {entry!r}")
    return entry


def load_idf(bundle_dir: str | Path, manifest: dict[str, Any], vocab_size: int) -> np.ndarray | None:
    """The bundle's IDF per embed token id, float32 [vocab_size] (None: it has no lexical table).
    Raises BundleError when the file is missing, unlisted, or not `vocab_size` levels."""
    entry = lexical_entry(manifest)
    if entry is None:
        return None
    path = Path(bundle_dir) / entry["file"]
    if entry["file"] not in (manifest.get("files") or {}):
        raise BundleError(f"{path.name}: lexical names a file the manifest does not list")
    try:
        with np.load(path, allow_pickle=False) as stored:
            levels = stored["levels"]
    except (OSError, ValueError, KeyError) as exc:
        raise BundleError(f"{path}: not a lexical table ({exc})") from exc
    if levels.ndim != 1 or levels.dtype != np.uint8 or len(levels) != vocab_size:
        raise BundleError(f"{path.name}: levels {levels.dtype} {levels.shape}, need uint8 [{vocab_size}] "
                          "(one per embed token id)")
    return levels.astype(np.float32) * np.float32(entry["scale"])


def document_frequency(id_lists: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """How many of the texts hold each id (int64 [vocab_size]), from each text's token ids."""
    held = [np.unique(np.asarray(ids, dtype=np.int64)) for ids in id_lists if len(ids)]
    if not held:
        return np.zeros(vocab_size, np.int64)
    return np.bincount(np.concatenate(held), minlength=vocab_size).astype(np.int64)


def smoothed_idf(df: np.ndarray, texts: int) -> np.ndarray:
    """`ln((texts + 1) / (df + 0.5))` of each id, float64: positive for every id, highest for an
    id no text held."""
    return np.log((texts + 1) / (np.asarray(df, dtype=np.float64) + 0.5))


def idf_levels(df: np.ndarray, texts: int, bits: int) -> tuple[np.ndarray, float]:
    """(levels uint8, scale) of the `smoothed_idf` of each id: the IDF rounded to one of 2**bits
    levels from 0 to its largest value (that of an id no text held)."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits={bits}: from 1 to 8")
    idf = smoothed_idf(df, texts)
    scale = float(idf.max()) / (2 ** bits - 1)
    return np.clip(np.rint(idf / scale), 0, 2 ** bits - 1).astype(np.uint8), scale


def sparse_vector(ids: Sequence[int], idf: np.ndarray) -> SparseVector:
    """(indices int64 ascending, values float32) of one text's token ids: `WEIGHTING`, ids whose
    weight is 0 left out. A text with no weighted id is the empty vector."""
    tokens, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
    values = idf[tokens] * (1.0 + np.log(counts, dtype=np.float32))
    keep = values > 0
    tokens, values = tokens[keep], values[keep].astype(np.float32)
    norm = float(np.linalg.norm(values))
    return tokens, (values / norm if norm > 0 else values)


class Postings:
    """The documents' sparse vectors by token id: for id t, the documents that hold it and their
    weights, so a query's sparse scores cost its ids' documents, not all of them."""

    def __init__(self, docs: Sequence[SparseVector]):
        self.size = len(docs)
        lengths = [len(idx) for idx, _ in docs]
        tokens = np.concatenate([idx for idx, _ in docs]) if docs else np.zeros(0, np.int64)
        values = np.concatenate([val for _, val in docs]) if docs else np.zeros(0, np.float32)
        owners = np.repeat(np.arange(len(docs)), lengths)
        order = np.argsort(tokens, kind="stable")
        self.tokens, self.owners = tokens[order], owners[order]
        self.values = values[order].astype(np.float32)

    def scores(self, query: SparseVector) -> np.ndarray:
        """The sparse dot product of `query` with every document, float32 [documents]."""
        out = np.zeros(self.size, np.float32)
        idx, val = query
        starts = np.searchsorted(self.tokens, idx, "left")
        stops = np.searchsorted(self.tokens, idx, "right")
        for start, stop, weight in zip(starts, stops, val, strict=True):
            # a document holds an id once, so no owner repeats within one id's slice
            out[self.owners[start:stop]] += weight * self.values[start:stop]
        return out


def sparse_dots(a: Sequence[SparseVector], b: Sequence[SparseVector]) -> np.ndarray:
    """The dot product of every vector of `a` with every vector of `b`, float64 [len(a), len(b)]."""
    postings = Postings(b)
    return np.stack([postings.scores(x) for x in a]).astype(np.float64) if a else np.zeros((0, len(b)))


def sparse_dot(x: SparseVector, y: SparseVector) -> float:
    """The dot product of two sparse vectors (indices ascending, each once)."""
    _, i, j = np.intersect1d(x[0], y[0], assume_unique=True, return_indices=True)
    return float(np.dot(x[1][i].astype(np.float64), y[1][j]))


def hybrid_scores(cosine: np.ndarray, weight: float, sparse: Callable[[], np.ndarray]) -> np.ndarray:
    """The hybrid score: (1 - w) x the dense cosines + w x the sparse dot products, `sparse()`
    computed only when w > 0 (at w = 0, `cosine` itself)."""
    return cosine if not weight else (1.0 - weight) * cosine + weight * sparse()
