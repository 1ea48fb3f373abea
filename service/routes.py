"""HTTP routes. Thin: parse (schemas) -> Service (pipeline) -> response models."""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.types import Receive

from service.errors import ERROR_TABLE, ClientClosed, InvalidRequest, Unauthorized
from service.pipeline import Service
from service.schemas import (
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    Info,
    NLIRequest,
    NLIResponse,
    OpenAIEmbeddingsRequest,
    OpenAIEmbeddingsResponse,
    SentimentRequest,
    SentimentResponse,
    Status,
)

T = TypeVar("T")
_bearer = HTTPBearer(auto_error=False, description="required only when the server sets an API key")


async def get_service(request: Request) -> Service:
    """The app's Service (set by create_app). `async` on purpose: FastAPI runs plain `def`
    dependencies in a worker thread, a thread hop per request for a dict lookup."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def api_key_ok(service: Service, credentials: str | None) -> bool:
    """True when no API key is configured, or `credentials` matches it (constant time)."""
    key = service.settings.api_key
    if key is None:
        return True
    return credentials is not None and secrets.compare_digest(credentials.encode(),
                                                              key.get_secret_value().encode())


async def require_api_key(service: ServiceDep,
                          creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Check `Authorization: Bearer <key>` when an API key is configured."""
    if not api_key_ok(service, creds.credentials if creds is not None else None):
        raise Unauthorized()


def _errors(*types: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error types, all with the shared error body."""
    return {ERROR_TABLE[t][0]: {"model": ErrorResponse, "description": ERROR_TABLE[t][1]} for t in types}


_INFER_ERRORS = _errors("malformed_json", "request_too_large", "invalid_request", "overloaded",
                        "internal_error", "not_ready")
# Attached by create_app only when an API key is configured, so /openapi.json tells the truth.
AUTH = {"dependencies": [Depends(require_api_key)], "responses": _errors("unauthorized")}
router = APIRouter()
inference = APIRouter(responses=_INFER_ERRORS)


def json_response(payload: dict[str, Any]) -> Response:
    """Serialise a route's result directly (numpy arrays included) with orjson.

    The routes build exactly their declared response model's shape (tests validate every
    route's response against that model, which is also its OpenAPI schema). Skipping FastAPI's
    validate-then-dump pass of that model saves a measurable share of the per-request CPU on
    the hot path. float32 vectors are written with the shortest repr that round-trips float32.
    """
    return Response(encode_json(payload), media_type="application/json")


def encode_json(payload: dict[str, Any]) -> bytes:
    """orjson bytes of a route result (numpy arrays written as lists)."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` in this task; if the client disconnects first (ASGI `receive` says so), a
    watcher cancels it, so its queued sentences are skipped, and ClientClosed is raised.

    This runs on every request, so it costs one small task and no `asyncio.wait`.
    """
    this = asyncio.current_task()
    assert this is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass  # the body is already read, so only a disconnect can come
        gone = True
        this.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        this.uncancel()
        raise ClientClosed("client closed the request") from None
    finally:
        watcher.cancel()


# ---- inference: one handler per route, shared by FastAPI and service.fastpath ----
async def embed_result(body: EmbedRequest, service: Service) -> dict[str, Any]:
    """POST /embed: each text's DiSAN vector; `normalize` L2-normalises them."""
    vectors, tokens = await service.embed(body.texts, body.normalize, body.truncate)
    runtime = service.require_ready()
    return {"model": runtime.name, "dim": runtime.dim, "embeddings": vectors, "usage": {"tokens": tokens}}


async def nli_result(body: NLIRequest, service: Service) -> dict[str, Any]:
    """POST /nli: a label and class probabilities per premise-hypothesis pair."""
    pairs = [(p.premise, p.hypothesis) for p in body.pairs]
    results, tokens = await service.nli(pairs, body.truncate)
    return {"model": service.require_ready().name, "results": results, "usage": {"tokens": tokens}}


async def sentiment_result(body: SentimentRequest, service: Service) -> dict[str, Any]:
    """POST /sentiment: fine-grained class, polarity and probabilities (+ attention if asked)."""
    results, tokens = await service.sentiment(body.texts, body.truncate, body.explain)
    return {"model": service.require_ready().name, "results": results, "usage": {"tokens": tokens}}


async def openai_embeddings_result(body: OpenAIEmbeddingsRequest, service: Service) -> dict[str, Any]:
    """POST /v1/embeddings in OpenAI's shape (normalised vectors, optional base64)."""
    texts = [body.input] if isinstance(body.input, str) else body.input
    runtime = service.require_ready()
    if body.dimensions is not None and body.dimensions != runtime.dim:
        raise InvalidRequest(f"dimensions: this model produces {runtime.dim}-dim vectors, "
                             f"got {body.dimensions}")
    vectors, tokens = await service.embed(texts, normalize=True, truncate=False, field="input")
    if body.encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        data: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        data = list(vectors)
    return {"object": "list", "model": runtime.name,
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


# path -> (request model, handler): what service.fastpath serves without FastAPI's routing.
HANDLERS: dict[str, tuple[type[BaseModel], Callable[[Any, Service], Awaitable[dict[str, Any]]]]] = {
    "/embed": (EmbedRequest, embed_result),
    "/nli": (NLIRequest, nli_result),
    "/sentiment": (SentimentRequest, sentiment_result),
    "/v1/embeddings": (OpenAIEmbeddingsRequest, openai_embeddings_result),
}


@inference.post("/embed", response_model=EmbedResponse, summary="Sentence embeddings")
async def embed(body: EmbedRequest, request: Request, service: ServiceDep) -> Response:
    """Embed each text with the DiSAN encoder; `normalize` L2-normalises the vectors."""
    return json_response(await unless_disconnected(request.receive, embed_result(body, service)))


@inference.post("/nli", response_model=NLIResponse, summary="Natural language inference")
async def nli(body: NLIRequest, request: Request, service: ServiceDep) -> Response:
    """Entailment / neutral / contradiction for each premise-hypothesis pair."""
    return json_response(await unless_disconnected(request.receive, nli_result(body, service)))


@inference.post("/sentiment", response_model=SentimentResponse, response_model_exclude_none=True,
                summary="Sentiment (5 SST classes + coarse polarity)")
async def sentiment(body: SentimentRequest, request: Request, service: ServiceDep) -> Response:
    """Fine-grained sentiment per text; `explain=true` adds attention maps and token weights."""
    return json_response(await unless_disconnected(request.receive, sentiment_result(body, service)))


@inference.post("/v1/embeddings", response_model=OpenAIEmbeddingsResponse,
                summary="OpenAI-compatible embeddings")
async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request,
                            service: ServiceDep) -> Response:
    """OpenAI `POST /v1/embeddings`: vectors are L2-normalised like OpenAI's; texts over the
    token limit are rejected (OpenAI does the same), `base64` is little-endian float32."""
    return json_response(await unless_disconnected(request.receive,
                                                   openai_embeddings_result(body, service)))


@inference.get("/info", response_model=Info, summary="Model, provider in use, limits")
async def info(service: ServiceDep) -> dict:
    """What is being served and how: the provider is the one the live session reports."""
    rt = service.require_ready()
    s = service.settings
    m = rt.manifest
    return {
        "model": rt.name, "dim": rt.dim, "provider": rt.provider, "providers": rt.providers,
        "variant": s.variant, "labels": rt.labels, "explain": rt.has_explain,
        "limits": {"max_texts_per_request": s.max_texts_per_request,
                   "max_chars_per_text": s.max_chars_per_text, "max_tokens": rt.max_tokens,
                   "max_request_bytes": s.max_request_bytes, "queue_limit": s.queue_limit},
        "batching": {"max_batch_size": s.max_batch_size, "max_wait_ms": s.max_wait_ms,
                     "max_batch_cells": s.max_batch_cells, "batch_concurrency": rt.batch_concurrency},
        "metrics": {task: dict(v.get("metrics") or {}) for task, v in (m.get("models") or {}).items()
                    if isinstance(v, dict)},
        "bundle": {k: m[k] for k in ("created", "max_len", "format_version", "versions") if k in m},
    }


@router.get("/health", response_model=Status, response_model_exclude_none=True,
            responses={503: {"model": Status}}, summary="Liveness")
async def health(service: ServiceDep) -> Any:
    """200 while the process is alive; 503 only if the bundle failed to load (restart me)."""
    if service.state == "failed":
        return JSONResponse({"status": "failed", "detail": service.detail}, status_code=503)
    return {"status": "ok"}


@router.get("/ready", response_model=Status, response_model_exclude_none=True,
            responses={503: {"model": Status}}, summary="Readiness")
async def ready(service: ServiceDep) -> Any:
    """200 once the bundle is loaded and warmed up; 503 while loading, draining or failed."""
    if service.state != "ready":
        return JSONResponse({"status": service.state, "detail": service.detail}, status_code=503,
                            headers={"Retry-After": "1"})
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    """Prometheus text exposition format."""
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
