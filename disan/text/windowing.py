"""Texts longer than the model's window: cut token ids into windows, pool the window vectors
(TORCH-FREE: stdlib + numpy only).

Shared by the service (`/embed`, `/v1/embeddings`, ...) and the Python `Encoder` API, so a long
text gets the same vector whichever way it is embedded. The API below is kept stable:

- `split_windows(ids, max_tokens, overlap=0)`: consecutive windows of at most `max_tokens` ids,
  each starting `max_tokens - overlap` after the previous one; the last window ends at the text's
  end. A text that fits is one window (the ids themselves), so short texts pay nothing.
- `pool_windows(vectors, lengths, lead=1.0)`: the token-weighted mean of the window vectors, the
  first window's weight multiplied by `lead`. Normalisation is left to the caller (the service
  normalises when asked, as for any vector).
- `EMBEDDING_LEAD`: the `lead` of an embedding (the `/embed` route's vectors, everywhere they are
  served); class probabilities and the NLI model's vectors pool with `lead` 1.
- `LongTextPolicy`: what to do with a text over `max_tokens`: `window` (split and pool),
  `truncate` (keep the first `max_tokens` ids) or `error` (refuse it).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np


class LongTextPolicy(StrEnum):
    """What happens to a text longer than the model's window (`max_tokens`)."""

    WINDOW = "window"       # cut into windows, embed each, pool (token-weighted mean)
    TRUNCATE = "truncate"   # keep the first max_tokens tokens, drop the rest
    ERROR = "error"         # refuse the text (the service answers 422 naming it)


LONG_TEXT_POLICIES: tuple[str, ...] = tuple(p.value for p in LongTextPolicy)

# An embedding's first window counts twice its tokens: a document's opening (its title, its first
# sentences) says what it is about more often than any later window does, which is also all that a
# model truncating at its window reads. A text that fits one window is unchanged. Chosen below the
# best weight on the staged retrieval dev sets, not at it (research/RECORD.md, "Window pooling").
EMBEDDING_LEAD = 2.0


def window_starts(n_tokens: int, max_tokens: int, overlap: int = 0) -> list[int]:
    """Start offsets of the windows `split_windows` cuts from `n_tokens` ids (see its docstring)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not 0 <= overlap < max_tokens:
        raise ValueError(f"overlap must be in [0, max_tokens), got {overlap} with max_tokens={max_tokens}")
    if n_tokens <= max_tokens:
        return [0]
    stride = max_tokens - overlap
    starts = list(range(0, n_tokens - max_tokens, stride))
    # The last window ends exactly at the text's end: a full window, not a few-token tail whose
    # vector would be noisy. It overlaps the previous window by more when the stride does not
    # divide the text; token weights in pool_windows count those tokens twice, which is small.
    starts.append(n_tokens - max_tokens)
    return starts


def split_windows(ids: Sequence[int], max_tokens: int, overlap: int = 0) -> list[list[int]]:
    """`ids` cut into windows of at most `max_tokens` ids, consecutive windows sharing `overlap`
    ids. Every id is in at least one window; an empty or fitting `ids` is one window."""
    ids = list(ids)
    return [ids[s:s + max_tokens] for s in window_starts(len(ids), max_tokens, overlap)]


def pool_windows(vectors: np.ndarray, lengths: Sequence[int], lead: float = 1.0) -> np.ndarray:
    """Token-weighted mean of window vectors [W, D] with token counts `lengths` [W] -> [D], the
    first window's weight multiplied by `lead` (> 0; 1: every token alike).

    Weighted by tokens so a text's vector does not depend on where the cuts fall as much as a
    plain mean would (a short window counts for its few tokens, not for a whole window).
    Not normalised: the caller does that when asked.
    """
    if not lead > 0:
        raise ValueError(f"lead must be > 0, got {lead}")
    vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise ValueError(f"vectors must be [windows, dim], got shape {vectors.shape}")
    weights = np.asarray(lengths, dtype=np.float64)
    if weights.shape != (vectors.shape[0],) or vectors.shape[0] == 0:
        raise ValueError(f"need one length per window (>= 1 window): {vectors.shape[0]} vectors, "
                         f"{weights.size} lengths")
    if (weights <= 0).any():
        raise ValueError("window lengths must be positive")
    weights[0] *= lead
    pooled = weights @ vectors.astype(np.float64) / weights.sum()
    return pooled.astype(vectors.dtype if vectors.dtype.kind == "f" else np.float32)
