"""Texts as the model sees them (TORCH-FREE): the one home of long-text preparation.

    prepare_texts (tokenize; fit, window, truncate or refuse)  ->  flat_rows  ->  the graph  ->  pool

`disan.Encoder` runs the rows in length-sorted batches itself; the service's engine feeds the
same rows to its micro-batcher (service.inference.longtext adds the request limits and the HTTP
errors). Both pool with `pool`: a text's single row as it is, a windowed text's rows as the
token-weighted mean of its windows (`disan.text.windowing.pool_windows`), an embedding's first
window counting `EMBEDDING_LEAD` times (`pool_embeddings`).

A text over `max_tokens` is windowed (every window a row of its own), truncated to its first
`max_tokens` tokens, or refused (`LongTextPolicy.ERROR`); a windowed text over
`max_tokens_per_text` is refused too. A text with no tokens is embedded as the empty text: one
unknown-word row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disan.text.pieces import AnyTokenizer
from disan.text.windowing import EMBEDDING_LEAD, LongTextPolicy, pool_windows, split_windows


@dataclass
class PreparedText:
    """One text as the model sees it: its tokens (those of a text that fits or was truncated; a
    windowed text's are dropped), its ids (all of them when windowed, the kept ones when
    truncated) and the rows fed to the graph (one row for a text that fits)."""

    tokens: list[str]
    ids: list[int]
    rows: list[list[int]]
    truncated: bool = False  # cut to max_tokens (LongTextPolicy.TRUNCATE)
    empty: bool = False      # no tokens: embedded as the empty text
    length: int = 0          # tokens of the whole text, before any cut

    @property
    def windowed(self) -> bool:
        return len(self.rows) > 1

    def note(self, index: int) -> dict | None:
        """What a response says about this text, or None when there is nothing to say."""
        if not (self.windowed or self.truncated or self.empty):
            return None
        return {"index": index, "tokens": len(self.ids), "windows": len(self.rows),
                "truncated": self.truncated, "empty": self.empty}


@dataclass(frozen=True)
class Refused:
    """A text that is not embedded: over `limit` = max_tokens under LongTextPolicy.ERROR
    (`size` False), or windowed but over `limit` = max_tokens_per_text (`size` True)."""

    index: int
    tokens: int
    limit: int
    size: bool


def prepare_texts(texts: Sequence[str], vocab: AnyTokenizer, max_tokens: int, policy: LongTextPolicy,
                  overlap: int = 0, max_tokens_per_text: int | None = None, keep_end: bool = False
                  ) -> tuple[list[PreparedText], list[Refused]]:
    """Every text prepared under `policy` (module docstring), and the texts refused; when any
    is refused, the prepared list lacks them (callers raise)."""
    out: list[PreparedText] = []
    refused: list[Refused] = []
    for i, text in enumerate(texts):
        tokens = vocab.tokens(text)
        n = len(tokens)
        if n == 0:
            # The model sees one unknown word (every row needs a position); explanations show it.
            out.append(PreparedText([vocab.unk_token], [], [[vocab.unk_id]], empty=True, length=0))
        elif n <= max_tokens:
            ids = vocab.ids(tokens)
            out.append(PreparedText(tokens, ids, [ids], length=n))
        elif policy is LongTextPolicy.TRUNCATE:
            tokens = tokens[-max_tokens:] if keep_end else tokens[:max_tokens]
            ids = vocab.ids(tokens)
            out.append(PreparedText(tokens, ids, [ids], truncated=True, length=n))
        elif policy is LongTextPolicy.ERROR:
            refused.append(Refused(i, n, max_tokens, size=False))
        elif max_tokens_per_text is not None and n > max_tokens_per_text:
            refused.append(Refused(i, n, max_tokens_per_text, size=True))
        else:
            # The token strings are dropped: only explanations use them, and those need texts that
            # fit, while a batch's worth of long texts would hold ~50 bytes per token.
            ids = vocab.ids(tokens)
            out.append(PreparedText([], ids, split_windows(ids, max_tokens, overlap), length=n))
    return out, refused


def flat_rows(items: Sequence[PreparedText]) -> list[list[int]]:
    """Every item's rows, in order (what the graph runs)."""
    return [row for item in items for row in item.rows]


def row_bounds(items: Sequence[PreparedText]) -> np.ndarray:
    """Item i owns rows [bounds[i], bounds[i + 1]) of `flat_rows(items)`."""
    return np.cumsum([0, *(len(item.rows) for item in items)])


def pool(items: Sequence[PreparedText], outputs: np.ndarray | Sequence[np.ndarray],
         lead: float = 1.0) -> np.ndarray:
    """One result per item from the results of `flat_rows(items)` (vectors or class
    probabilities): a single row as it is, several pooled by `pool_windows` (token-weighted
    mean, the first window's weight times `lead`). float32 [items, ...]."""
    outputs = np.asarray(outputs)
    if len(outputs) == len(items):  # no text was windowed: one row each
        return outputs.astype(np.float32, copy=False)
    bounds = row_bounds(items)
    out = outputs[bounds[:-1]].astype(np.float32, copy=False)
    for i in np.flatnonzero(np.diff(bounds) > 1):
        lo, hi = bounds[i], bounds[i + 1]
        out[i] = pool_windows(outputs[lo:hi], [len(r) for r in items[i].rows], lead)
    return out


def pool_embeddings(items: Sequence[PreparedText], outputs: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """`pool` of the embed route's vectors: a windowed text's first window counts `EMBEDDING_LEAD`
    times its tokens (disan.text.windowing)."""
    return pool(items, outputs, EMBEDDING_LEAD)
