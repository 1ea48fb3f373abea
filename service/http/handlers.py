"""Inference handlers, HTTP-neutral: a validated request model + the engine -> a JSON-able dict.

Both front ends call these: FastAPI's routes (service.http.routes) and the fast path
(service.http.fastpath), through the path table of service.http.endpoints.
Neither this module nor the engine knows about ASGI or FastAPI, so a new
front end (gRPC, a queue consumer) would call the same functions.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np
import orjson

from disan.bundle.dimensions import served_size_problem
from disan.bundle.lexical import hybrid_scores, sparse_dot, sparse_dots
from disan.runtime.encoder import prefixed
from service.common.errors import InvalidRequest, ModelNotFound, RequestTooLarge
from service.http.openai_schemas import OpenAIEmbeddingsRequest
from service.http.schemas import (
    EmbedRequest,
    NLIRequest,
    SentimentRequest,
    SimilarityRequest,
    TokenizeRequest,
)
from service.inference.engine import Engine
from service.inference.longtext import OneText, Tokenized
from service.inference.tokenizing import require_idf, sparse_of, tokenize_only


def api_key_ok(engine: Engine, credentials: str | None) -> bool:
    """True when no API key is configured, or `credentials` matches it (constant time)."""
    key = engine.settings.api_key
    if key is None:
        return True
    return credentials is not None and secrets.compare_digest(credentials.encode(),
                                                              key.get_secret_value().encode())


def encode_json(payload: Any) -> bytes:
    """orjson bytes of a route result (a dict, or a TEI route's list; numpy arrays written as lists)."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_embeddings(vectors: Any, encoding_format: str) -> Any:
    """float32 [B, D] as sent: the array itself (orjson writes the floats), or one base64 string
    of little-endian float32 per row (bench/stages.py measures both encodings)."""
    if encoding_format != "base64":
        return vectors
    little = vectors.astype("<f4", copy=False)
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]


def long_text(body: Any, engine: Engine) -> str:
    """The request's long-text policy: its `long_text`, else truncate=true, else the server's."""
    if body.long_text is not None:
        return body.long_text
    return "truncate" if body.truncate else engine.settings.long_text


def token_count(items: list[Tokenized]) -> int:
    return sum(len(t.ids) for t in items)


def prefix_size(engine: Engine, dimensions: int | None) -> int | None:
    """How many components of each vector to send (None: all): a request's `dimensions` when it
    is a size the model serves (`matryoshka_dims`, or any up to its principal axes' count), else a
    422 naming them."""
    if dimensions is None:
        return None
    runtime = engine.require_ready()
    problem = served_size_problem(dimensions, runtime.manifest, runtime.dim)
    if problem is not None:
        raise InvalidRequest(problem)
    return dimensions if dimensions < runtime.dim else None


async def embed_result(body: EmbedRequest, engine: Engine) -> dict[str, Any]:
    """POST /embed: each text's DiSAN vector (a long text's: its windows pooled); `normalize`
    L2-normalises them; `explain` adds each text's tokens and source2token weights; `notes` says
    which texts were windowed, truncated or empty; `dimensions` cuts them to a trained prefix
    (before they are normalised)."""
    policy = long_text(body, engine)
    size = prefix_size(engine, body.dimensions)
    normalize = body.normalize and size is None  # a prefix is normalised once cut
    if body.explain:
        vectors, items, explanations = await engine.embed_explained(body.texts, normalize, policy)
    else:
        vectors, items = await engine.embed(body.texts, normalize, policy)
    runtime = engine.require_ready()
    if size is not None:
        vectors = prefixed(vectors, size, body.normalize, runtime.projection)
    result = {"model": runtime.name, "dim": size or runtime.dim,
              "embeddings": encode_embeddings(vectors, body.encoding_format),
              "usage": {"tokens": token_count(items)}}
    if body.explain:
        result["explanations"] = explanations
    notes = [n for i, t in enumerate(items) if (n := t.note(i)) is not None]
    if notes:
        result["notes"] = notes
    return result


async def nli_result(body: NLIRequest, engine: Engine) -> dict[str, Any]:
    """POST /nli: a label and class probabilities per premise-hypothesis pair."""
    pairs = [(p.premise, p.hypothesis) for p in body.pairs]
    results, tokens = await engine.nli(pairs, long_text(body, engine), body.explain)
    return {"model": engine.require_ready().name, "results": results, "usage": {"tokens": tokens}}


async def sentiment_result(body: SentimentRequest, engine: Engine) -> dict[str, Any]:
    """POST /sentiment: fine-grained class, polarity and probabilities (+ attention if asked)."""
    results, tokens = await engine.sentiment(body.texts, long_text(body, engine), body.explain)
    return {"model": engine.require_ready().name, "results": results, "usage": {"tokens": tokens}}


def served_models(engine: Engine) -> list[str]:
    """Names /v1 answers to: the served model's, then the aliases from settings."""
    name = engine.require_ready().name
    return [name, *(a for a in engine.settings.model_aliases if a != name)]


def check_model(engine: Engine, model: str | None, strict: bool | None = None) -> None:
    """OpenAI's 404 `model_not_found` for a `model` this server does not serve, where `strict`
    (default: the openai_strict_model setting); otherwise any name is answered by the served
    model (clients send their own default, e.g. text-embedding-ada-002)."""
    if not (engine.settings.openai_strict_model if strict is None else strict):
        return
    names = served_models(engine)
    if model is not None and model not in names:
        raise ModelNotFound(f"the model `{model}` is not served here; served: {', '.join(names)} "
                            "(GET /v1/models). Set `model` to one of them, or add the name to the "
                            "server's model_aliases (DISAN_MODEL_ALIASES)")


def models_result(engine: Engine) -> dict[str, Any]:
    """GET /v1/models: the served model and its aliases, in OpenAI's list shape."""
    created = engine.require_ready().manifest.get("created")
    try:
        stamp = int(datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp())
    except ValueError:
        stamp = 0
    return {"object": "list", "data": [{"id": name, "object": "model", "created": stamp,
                                        "owned_by": "disan-serve"} for name in served_models(engine)]}


async def openai_embeddings_result(body: OpenAIEmbeddingsRequest, engine: Engine) -> dict[str, Any]:
    """POST /v1/embeddings in OpenAI's shape (normalised vectors, optional base64; `dimensions`:
    a trained prefix of each vector, normalised once cut)."""
    one = isinstance(body.input, str)
    texts = [body.input] if one else body.input
    runtime = engine.require_ready()
    check_model(engine, body.model)
    size = prefix_size(engine, body.dimensions)
    s = engine.settings
    policy = "truncate" if s.openai_truncate else s.openai_long_text
    vectors, items = await engine.embed(texts, size is None, policy, OneText("input") if one else "input",
                                        s.openai_max_inputs)
    if size is not None:
        vectors = prefixed(vectors, size, True, runtime.projection)
    data = list(encode_embeddings(vectors, body.encoding_format))
    tokens = token_count(items)
    return {"object": "list", "model": runtime.name,
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                      "truncated_inputs": sum(t.truncated for t in items),
                      "windowed_inputs": sum(t.windowed for t in items),
                      "empty_inputs": sum(t.empty for t in items)}}


async def tokenize_result(body: TokenizeRequest, engine: Engine) -> dict[str, Any]:
    """POST /tokenize: the model's tokens and ids per text, and whether each fits max_tokens."""
    items = await tokenize_only(engine, body.texts)
    runtime = engine.require_ready()
    limit = runtime.max_tokens
    vocab = runtime.tokenizer("embed")
    return {"model": runtime.name, "max_tokens": limit,
            "results": [{"tokens": t.tokens, "ids": t.ids,
                         "unknown": [i for i, tok in enumerate(t.tokens) if tok not in vocab],
                         "count": len(t.tokens), "over_limit": len(t.tokens) > limit} for t in items]}


async def similarity_result(body: SimilarityRequest, engine: Engine) -> dict[str, Any]:
    """POST /similarity: cosine of `pairs`, of `texts` ranked against `query`, or of all `texts`;
    with `hybrid` w, (1 - w) x the cosine + w x the dot product of their sparse vectors
    (disan.bundle.lexical, from the same tokens)."""
    limit = engine.settings.max_texts_per_request
    policy = long_text(body, engine)
    weight = body.hybrid or 0.0
    if weight:
        require_idf(engine)  # 424 before any work

    async def vectors(texts: list[str], field: str, member: str = "") -> tuple[np.ndarray, list, int]:
        vecs, items = await engine.embed(texts, True, policy, field, limit, member)
        return vecs, await sparse_of(engine, items) if weight else [], token_count(items)

    def mixed(dense: np.ndarray, sparse: Callable[[], np.ndarray]) -> np.ndarray:
        return hybrid_scores(cosines(dense), weight, sparse)

    out: dict[str, Any] = {"model": engine.require_ready().name}
    if body.pairs is not None:
        if len(body.pairs) > limit:  # both sides would pass the per-list check on their own
            raise RequestTooLarge(f"pairs: {len(body.pairs)} items, at most {limit} per request")
        a, sparse_a, tokens_a = await vectors([p.a for p in body.pairs], "pairs", ".a")
        b, sparse_b, tokens_b = await vectors([p.b for p in body.pairs], "pairs", ".b")
        out["scores"] = mixed((a * b).sum(axis=1), lambda: np.array(
            [sparse_dot(x, y) for x, y in zip(sparse_a, sparse_b, strict=True)])).tolist()
        tokens = tokens_a + tokens_b
    else:
        assert body.texts is not None  # the request model allows no other form
        docs, sparse_docs, tokens = await vectors(body.texts, "texts")
        if body.query is None:
            out["matrix"] = mixed(docs @ docs.T, lambda: sparse_dots(sparse_docs, sparse_docs)).tolist()
        else:
            query, sparse_query, query_tokens = await vectors([body.query], OneText("query"))
            scores = mixed(docs @ query[0], lambda: sparse_dots(sparse_query, sparse_docs)[0])
            order = np.argsort(-scores, kind="stable")[: body.top_k]
            out["ranking"] = [{"index": int(i), "score": float(scores[i])} for i in order]
            tokens += query_tokens
    out["usage"] = {"tokens": tokens}
    return out


def cosines(dots: np.ndarray) -> np.ndarray:
    """Dot products of unit vectors as float64 cosines (rounding can leave them just past +-1)."""
    return np.clip(dots.astype(np.float64), -1.0, 1.0)
