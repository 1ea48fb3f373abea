"""A request's texts of any length: the request limits and their errors around the one
preparation of texts (`disan.text.prepare`, which `disan.Encoder` uses too) (HTTP-free).

A text over the window (`max_tokens`) is, by the request's or the server's `LongTextPolicy`:
windowed (cut by `disan.text.windowing.split_windows`, every window a row of its own in the batcher,
the text's result the token-weighted mean of its rows: `pool_rows`; an embedding's first window
counts twice: `pool_embedding_rows`), truncated, or refused.
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

from disan.text.pieces import AnyTokenizer
from disan.text.prepare import PreparedText, flat_rows, pool, pool_embeddings
from disan.text.prepare import prepare_texts as prepare_rows
from disan.text.windowing import LongTextPolicy
from service.common.errors import InvalidRequest, RequestTooLarge

# One text as the model sees it (tokens, ids, rows; truncated / empty), as `disan.Encoder` sees it.
Tokenized = PreparedText
# One result per text from the results of `flat_rows(items)`.
pool_rows = pool
pool_embedding_rows = pool_embeddings
__all__ = ["TRUNCATE_LEFT", "Limits", "OneText", "Tokenized", "check_chars", "flat_rows", "location",
           "pool_embedding_rows", "pool_rows", "prepare_texts", "require_fitting"]

# How to get an over-long text embedded, where it is refused (long_text=error).
_ERROR_HINTS = {"input": "the server's openai_long_text is error; window or truncate embed it"}
_DEFAULT_HINT = "send long_text=window or long_text=truncate"
# The policy of a TEI request with truncate=true and truncation_direction=left: truncate, keeping
# the text's last max_tokens tokens (service.inference.engine.Engine.limits reads it).
TRUNCATE_LEFT = "truncate_left"


class OneText(str):
    """A request field that held one text, not a list (`query`; `input` given as a string): its
    errors name the field alone."""


def location(field: str, i: int, member: str) -> str:
    """Where an error is, in the API's one notation: ``texts[0]``, ``pairs[2].premise``, ``query``."""
    return str(field) if isinstance(field, OneText) else f"{field}[{i}]{member}"


@dataclass(frozen=True)
class Limits:
    """The long-text settings one request is prepared under."""

    max_tokens: int             # the window: longest row fed to the model
    policy: LongTextPolicy
    overlap: int = 0            # tokens shared by consecutive windows
    max_tokens_per_text: int = 8192
    max_tokens_per_request: int = 1 << 20
    keep_end: bool = False      # truncate keeps the last max_tokens tokens (TRUNCATE_LEFT)


def _refusal(problems: list[tuple[bool, str]]) -> InvalidRequest | RequestTooLarge:
    """One error naming every offending item: 413 if any is over a size limit, else 422."""
    message = "; ".join(text for _, text in problems)
    return RequestTooLarge(message) if any(big for big, _ in problems) else InvalidRequest(message)


def prepare_texts(texts: Sequence[str], vocab: AnyTokenizer, limits: Limits, field: str = "texts",
                  member: str = "") -> list[Tokenized]:
    """Tokenize `texts` and apply `limits` (module docstring); errors name every offending item."""
    out, refused = prepare_rows(texts, vocab, limits.max_tokens, limits.policy, limits.overlap,
                                limits.max_tokens_per_text, limits.keep_end)
    problems: list[tuple[bool, str]] = []
    for r in refused:
        where = location(field, r.index, member)
        if r.size:
            problems.append((True, f"{where}: {r.tokens} tokens, at most {r.limit} per text (split the "
                                   "document, or long_text=truncate keeps its start)"))
        else:
            hint = _ERROR_HINTS.get(str(field), _DEFAULT_HINT)
            problems.append((False, f"{where}: {r.tokens} tokens, at most {r.limit} ({hint})"))
    if problems:
        raise _refusal(problems)
    total = sum(t.length for t in out)
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
