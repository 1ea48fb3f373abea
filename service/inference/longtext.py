"""Texts of any length: tokenize, apply the long-text policy and the limits, cut windows (HTTP-free).

A text over the window (`max_tokens`) is, by the request's or the server's `LongTextPolicy`:
windowed (cut by `disan.text.windowing.split_windows`, every window a row of its own in the batcher,
the text's result the token-weighted mean of its rows: `pool_rows`), truncated, or refused.
Windowing is bounded per text (`max_tokens_per_text`, OpenAI's 8,192 by default) and per request
(`max_tokens_per_request`), both checked after tokenizing and before any model work; the rows
then queue in the batcher like any sentences, which admission control counts.

A text with no tokens (only spaces or control characters: document loaders produce "\\n\\n")
is embedded as the empty text (one unknown-word row), said in the response, never a 422 that
sinks its whole batch. Every offending item is named in one error, not only the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disan.text.tokenizer import UNK, UNK_TOKEN, Vocab
from disan.text.windowing import LongTextPolicy, pool_windows, split_windows
from service.common.errors import InvalidRequest, RequestTooLarge

# How to get an over-long text embedded, where it is refused (long_text=error).
_ERROR_HINTS = {"input": "the server's openai_long_text is error; window or truncate embed it"}
_DEFAULT_HINT = "send long_text=window or long_text=truncate"


class OneText(str):
    """A request field that held one text, not a list (`query`; `input` given as a string): its
    errors name the field alone."""


def location(field: str, i: int, member: str) -> str:
    """Where an error is, in the API's one notation: ``texts[0]``, ``pairs[2].premise``, ``query``."""
    return str(field) if isinstance(field, OneText) else f"{field}[{i}]{member}"


@dataclass
class Tokenized:
    """One text as the model sees it: its ids (all of them when windowed, the kept ones when
    truncated) and the rows fed to the graph (one row for a text that fits)."""

    tokens: list[str]
    ids: list[int]
    rows: list[list[int]]
    truncated: bool = False  # cut to max_tokens (long_text=truncate)
    empty: bool = False      # no tokens: embedded as the empty text

    @property
    def windowed(self) -> bool:
        return len(self.rows) > 1

    def note(self, index: int) -> dict | None:
        """What the response says about this text, or None when there is nothing to say."""
        if not (self.windowed or self.truncated or self.empty):
            return None
        return {"index": index, "tokens": len(self.ids), "windows": len(self.rows),
                "truncated": self.truncated, "empty": self.empty}


@dataclass(frozen=True)
class Limits:
    """The long-text settings one request is prepared under."""

    max_tokens: int             # the window: longest row fed to the model
    policy: LongTextPolicy
    overlap: int = 0            # tokens shared by consecutive windows
    max_tokens_per_text: int = 8192
    max_tokens_per_request: int = 1 << 20


def _refusal(problems: list[tuple[bool, str]]) -> InvalidRequest | RequestTooLarge:
    """One error naming every offending item: 413 if any is over a size limit, else 422."""
    message = "; ".join(text for _, text in problems)
    return RequestTooLarge(message) if any(big for big, _ in problems) else InvalidRequest(message)


def prepare_texts(texts: Sequence[str], vocab: Vocab, limits: Limits, field: str = "texts",
                  member: str = "") -> list[Tokenized]:
    """Tokenize `texts` and apply `limits` (module docstring); errors name every offending item."""
    out: list[Tokenized] = []
    problems: list[tuple[bool, str]] = []
    total = 0
    for i, text in enumerate(texts):
        tokens = vocab.tokens(text)
        n = len(tokens)
        total += n
        where = location(field, i, member)
        if n == 0:
            # The model sees one unknown word (every row needs a position); explanations show it.
            out.append(Tokenized([UNK_TOKEN], [], [[UNK]], empty=True))
            continue
        if n <= limits.max_tokens:
            ids = vocab.ids(tokens)
            out.append(Tokenized(tokens, ids, [ids]))
        elif limits.policy is LongTextPolicy.TRUNCATE:
            tokens = tokens[:limits.max_tokens]
            ids = vocab.ids(tokens)
            out.append(Tokenized(tokens, ids, [ids], truncated=True))
        elif limits.policy is LongTextPolicy.ERROR:
            hint = _ERROR_HINTS.get(str(field), _DEFAULT_HINT)
            problems.append((False, f"{where}: {n} tokens, at most {limits.max_tokens} ({hint})"))
        elif n > limits.max_tokens_per_text:
            problems.append((True, f"{where}: {n} tokens, at most {limits.max_tokens_per_text} per "
                                   "text (split the document, or long_text=truncate keeps its start)"))
        else:
            # The token strings are dropped: only explanations use them, and those need texts that
            # fit, while a request's worth of long texts would hold ~50 bytes per token.
            ids = vocab.ids(tokens)
            out.append(Tokenized([], ids, split_windows(ids, limits.max_tokens, limits.overlap)))
    if problems:
        raise _refusal(problems)
    if total > limits.max_tokens_per_request:
        raise RequestTooLarge(f"{field}: {total} tokens in the request, at most "
                              f"{limits.max_tokens_per_request} (send fewer texts per request)")
    return out


def check_chars(texts: Sequence[str], field: str, member: str, max_chars: int) -> None:
    """413 naming every text over `max_chars` characters (before tokenizing: cheap)."""
    over = [f"{location(field, i, member)}: {len(t)} characters" for i, t in enumerate(texts)
            if len(t) > max_chars]
    if over:
        raise RequestTooLarge(f"{'; '.join(over)}; at most {max_chars} per text")


def require_fitting(items: Sequence[Tokenized], field: str, member: str = "") -> None:
    """Explanations are per token of one graph call: refuse windowed texts, naming each."""
    long = [location(field, i, member) for i, t in enumerate(items) if t.windowed]
    if long:
        raise InvalidRequest(f"{', '.join(long)}: longer than max_tokens; explain=true needs texts "
                             "that fit (long_text=truncate cuts them)")


def flat_rows(items: Sequence[Tokenized]) -> list[list[int]]:
    """Every item's rows, in order (what the batcher runs)."""
    return [row for item in items for row in item.rows]


def pool_rows(items: Sequence[Tokenized], outputs: Sequence[np.ndarray]) -> np.ndarray:
    """One result per item from the results of `flat_rows(items)`: a text's single row as it
    is, several rows pooled by `pool_windows` (token-weighted mean). float32 [B, ...]."""
    pooled, at = [], 0
    for item in items:
        k = len(item.rows)
        if k == 1:
            pooled.append(outputs[at])
        else:
            pooled.append(pool_windows(np.stack(outputs[at:at + k]), [len(r) for r in item.rows]))
        at += k
    return np.stack(pooled).astype(np.float32, copy=False)
