"""Inference handlers, HTTP-neutral: a validated request model + the engine -> a JSON-able dict.

Both front ends call these: FastAPI's routes (service.routes) and the fast path
(service.fastpath). Neither this module nor the engine knows about ASGI or FastAPI, so a new
front end (gRPC, a queue consumer) would call the same functions.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import BaseModel

from service.engine import Engine
from service.errors import InvalidRequest
from service.schemas import EmbedRequest, NLIRequest, OpenAIEmbeddingsRequest, SentimentRequest


def api_key_ok(engine: Engine, credentials: str | None) -> bool:
    """True when no API key is configured, or `credentials` matches it (constant time)."""
    key = engine.settings.api_key
    if key is None:
        return True
    return credentials is not None and secrets.compare_digest(credentials.encode(),
                                                              key.get_secret_value().encode())


def encode_json(payload: dict[str, Any]) -> bytes:
    """orjson bytes of a route result (numpy arrays written as lists)."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


async def embed_result(body: EmbedRequest, engine: Engine) -> dict[str, Any]:
    """POST /embed: each text's DiSAN vector; `normalize` L2-normalises them; `explain` adds
    each text's tokens and source2token weights."""
    if body.explain:
        vectors, tokens, explanations = await engine.embed_explained(body.texts, body.normalize,
                                                                     body.truncate)
    else:
        vectors, tokens = await engine.embed(body.texts, body.normalize, body.truncate)
    runtime = engine.require_ready()
    result = {"model": runtime.name, "dim": runtime.dim, "embeddings": vectors, "usage": {"tokens": tokens}}
    if body.explain:
        result["explanations"] = explanations
    return result


async def nli_result(body: NLIRequest, engine: Engine) -> dict[str, Any]:
    """POST /nli: a label and class probabilities per premise-hypothesis pair."""
    pairs = [(p.premise, p.hypothesis) for p in body.pairs]
    results, tokens = await engine.nli(pairs, body.truncate, body.explain)
    return {"model": engine.require_ready().name, "results": results, "usage": {"tokens": tokens}}


async def sentiment_result(body: SentimentRequest, engine: Engine) -> dict[str, Any]:
    """POST /sentiment: fine-grained class, polarity and probabilities (+ attention if asked)."""
    results, tokens = await engine.sentiment(body.texts, body.truncate, body.explain)
    return {"model": engine.require_ready().name, "results": results, "usage": {"tokens": tokens}}


async def openai_embeddings_result(body: OpenAIEmbeddingsRequest, engine: Engine) -> dict[str, Any]:
    """POST /v1/embeddings in OpenAI's shape (normalised vectors, optional base64)."""
    texts = [body.input] if isinstance(body.input, str) else body.input
    runtime = engine.require_ready()
    if body.dimensions is not None and body.dimensions != runtime.dim:
        raise InvalidRequest(f"dimensions: this model produces {runtime.dim}-dim vectors, "
                             f"got {body.dimensions}")
    vectors, tokens = await engine.embed(texts, normalize=True, truncate=False, field="input")
    if body.encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        data: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        data = list(vectors)
    return {"object": "list", "model": runtime.name,
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


# path -> (request model, handler): what service.fastpath serves without FastAPI's routing.
HANDLERS: dict[str, tuple[type[BaseModel], Callable[[Any, Engine], Awaitable[dict[str, Any]]]]] = {
    "/embed": (EmbedRequest, embed_result),
    "/nli": (NLIRequest, nli_result),
    "/sentiment": (SentimentRequest, sentiment_result),
    "/v1/embeddings": (OpenAIEmbeddingsRequest, openai_embeddings_result),
}


