"""The requests that run no graph: a text's tokens and ids (/tokenize), the text of ids (/decode) and
sparse lexical vectors (/embed_sparse, and the sparse half of a hybrid score). They read the loaded
bundle's tokenizer and lexical table through the `Engine`, under the same limits as the requests
that do run a graph, and move off the event loop when there is a lot to do."""

from __future__ import annotations

import asyncio

import numpy as np

from disan.bundle.lexical import NO_TABLE, SparseVector, sparse_vector
from disan.text.windowing import LongTextPolicy
from service.common.errors import InvalidRequest, NoLexicalTable
from service.inference.engine import INLINE_CHARS, INLINE_TOKENS, Engine
from service.inference.longtext import Tokenized


def require_idf(engine: Engine) -> np.ndarray:
    """The bundle's IDF per embed token id, or NoLexicalTable (424): it serves no sparse vectors."""
    idf = engine.require_ready().idf
    if idf is None:
        raise NoLexicalTable(f"this bundle {NO_TABLE}, so it serves no sparse vectors")
    return idf


async def embed_sparse(engine: Engine, texts: list[str], policy: LongTextPolicy | str, field: str = "texts"
                       ) -> list[SparseVector]:
    """Per text its sparse lexical vector (disan.bundle.lexical; every window of a long text);
    NoLexicalTable (424), before any work, when the bundle has no lexical table."""
    require_idf(engine)
    return await sparse_of(engine, await engine.prepare_async(texts, policy, field))


async def sparse_of(engine: Engine, items: list[Tokenized]) -> list[SparseVector]:
    """The sparse lexical vectors of tokenized texts, from the ids the dense vectors read (off the
    event loop when there are many)."""
    idf = require_idf(engine)

    def run() -> list[SparseVector]:
        return [sparse_vector(item.ids, idf) for item in items]

    return await asyncio.to_thread(run) if sum(len(i.ids) for i in items) > INLINE_TOKENS else run()


async def tokenize_only(engine: Engine, texts: list[str], field: str = "texts") -> list[Tokenized]:
    """Tokens and ids of each text, uncut (a text over max_tokens is reported, not refused)."""
    vocab = engine.require_ready().tokenizer("embed")
    engine.check_sizes(texts, field)

    def run() -> list[Tokenized]:
        return [Tokenized(tokens, ids, [ids]) for tokens in map(vocab.tokens, texts)
                for ids in [vocab.ids(tokens)]]

    return await asyncio.to_thread(run) if sum(map(len, texts)) > INLINE_CHARS else run()


async def decode_ids(engine: Engine, sequences: list[list[int]], skip_special_tokens: bool,
                     field: str = "ids") -> list[str]:
    """The text of each id sequence, as the embed route's tokenizer decodes it (the ids /tokenize
    gives); an id the tokenizer lacks is a 422 naming it."""
    vocab = engine.require_ready().tokenizer("embed")
    engine.check_count(sequences, field)

    def run() -> list[str]:
        texts = []
        for i, ids in enumerate(sequences):
            try:
                texts.append(vocab.decode(ids, skip_special_tokens))
            except ValueError as exc:
                raise InvalidRequest(f"{field}[{i}]: {exc}") from None
        return texts

    return await asyncio.to_thread(run) if sum(map(len, sequences)) > INLINE_TOKENS else run()
