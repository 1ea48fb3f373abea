"""FastAPI routes. Thin: FastAPI parses (schemas) -> service.http.handlers -> JSON response.

The inference routes here are what OpenAPI documents and what requests take when the fast path
is off; the handlers they call are the same as the fast path's.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from disan.bundle.dimensions import any_size_up_to
from disan.bundle.lexical import WEIGHTING
from disan.bundle.manifest import fingerprints_in_use, matryoshka_dims
from service.common.errors import ERROR_TABLE, Unauthorized
from service.http.asgi import unless_disconnected
from service.http.endpoints import embed_any, root_any, similarity_any, tokenize_any
from service.http.errors import TEI_SCOPE_KEY
from service.http.handlers import (
    api_key_ok,
    check_model,
    encode_json,
    models_result,
    nli_result,
    openai_embeddings_result,
    sentiment_result,
)
from service.http.openai_schemas import (
    OpenAIEmbeddingsRequest,
    OpenAIEmbeddingsResponse,
    OpenAIModel,
    OpenAIModelList,
)
from service.http.schemas import (
    EmbedResponse,
    ErrorResponse,
    Info,
    NLIRequest,
    NLIResponse,
    SentimentRequest,
    SentimentResponse,
    SimilarityResponse,
    Status,
    TokenizeResponse,
)
from service.http.tei import (
    cohere_rerank_result,
    predict_result,
    rerank_result,
    tei_decode_result,
    tei_embed_sparse_result,
    tei_info,
)
from service.http.tei_schemas import (
    EMBED_BODY,
    ROOT_BODY,
    SIMILARITY_BODY,
    TEI_MODELS,
    TOKENIZE_BODY,
    CohereRerankRequest,
    CohereRerankResponse,
    TEIDecodeRequest,
    TEIEmbedSparseRequest,
    TEIErrorResponse,
    TEIPrediction,
    TEIPredictRequest,
    TEIRank,
    TEIRerankRequest,
    TEISimpleToken,
    TEISparseValue,
)
from service.inference.engine import Engine

_bearer = HTTPBearer(auto_error=False, description="required only when the server sets an API key")


async def get_engine(request: Request) -> Engine:
    """The app's Engine (set by create_app). `async` on purpose: FastAPI runs plain `def`
    dependencies in a worker thread, a thread hop per request for a dict lookup."""
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(get_engine)]


async def require_api_key(engine: EngineDep,
                          creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Check `Authorization: Bearer <key>` when an API key is configured."""
    if not api_key_ok(engine, creds.credentials if creds is not None else None):
        raise Unauthorized()


def _errors(*types: str, model: Any = ErrorResponse) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error types, all with the shared error body (or
    `model`: TEI's, or either on the routes both families share)."""
    return {ERROR_TABLE[t][0]: {"model": model, "description": ERROR_TABLE[t][1]} for t in types}


_INFER_TYPES = ("malformed_json", "request_too_large", "invalid_request", "overloaded", "internal_error",
                "not_ready")
_INFER_ERRORS = _errors(*_INFER_TYPES)
# TEI's routes answer TEI's error body; the shared ones the body of the request's family.
_TEI_ERRORS = _errors(*_INFER_TYPES, model=TEIErrorResponse)
_EITHER_ERRORS = _errors(*_INFER_TYPES, model=ErrorResponse | TEIErrorResponse)
# Attached by create_app only when an API key is configured, so /openapi.json tells the truth.
AUTH = {"dependencies": [Depends(require_api_key)], "responses": _errors("unauthorized")}
router = APIRouter()
inference = APIRouter(responses=_INFER_ERRORS)


def json_response(payload: Any) -> Response:
    """Serialise a route's result directly (numpy arrays included) with orjson.

    The routes build exactly their declared response model's shape (tests validate every
    route's response against that model, which is also its OpenAPI schema). Skipping FastAPI's
    validate-then-dump pass of that model saves a measurable share of the per-request CPU on
    the hot path. float32 vectors are written with the shortest repr that round-trips float32.
    """
    return Response(encode_json(payload), media_type="application/json")


def _family(request: Request, body: Any) -> None:
    """Mark a TEI-shaped request, so its errors are answered in TEI's shape (service.http.errors)."""
    if isinstance(body, TEI_MODELS):
        request.scope[TEI_SCOPE_KEY] = True


TEI_VECTORS = list[list[float]]


@inference.post("/embed", response_model=EmbedResponse | TEI_VECTORS, responses=_EITHER_ERRORS,
                summary="Sentence embeddings (ours, or TEI's body)")
async def embed(body: EMBED_BODY, request: Request, engine: EngineDep) -> Response:
    """Embed each text with the DiSAN encoder; `normalize` L2-normalises the vectors.

    A body with `inputs` is text-embeddings-inference's (`inputs`, `normalize` (default true),
    `truncate`, `truncation_direction`, `dimensions`), answered as TEI does: a bare list of
    vectors; errors then have TEI's body `{"error", "error_type"}`."""
    _family(request, body)
    return json_response(await unless_disconnected(request.receive, embed_any(body, engine)))


@inference.post("/", response_model=TEI_VECTORS | list[float], responses=_TEI_ERRORS,
                summary="text-embeddings-inference's root route: embed, or similarity")
async def tei_root(body: ROOT_BODY, request: Request, engine: EngineDep) -> Response:
    """TEI's `POST /`, where huggingface_hub's `InferenceClient(base_url=...)` posts: TEI's embed
    body (`inputs` a string or a list) -> a list of vectors; its similarity body (`inputs`:
    {source_sentence, sentences}) -> a cosine per sentence. `GET /` is the playground."""
    return json_response(await unless_disconnected(request.receive, root_any(body, engine)))


@inference.post("/embed_sparse", response_model=list[list[TEISparseValue]],
                responses=_TEI_ERRORS | _errors("no_lexical_table", model=TEIErrorResponse),
                summary="Sparse lexical vectors for hybrid search (TEI's)")
async def embed_sparse(body: TEIEmbedSparseRequest, request: Request, engine: EngineDep) -> Response:
    """TEI's `POST /embed_sparse`: per input `[{index, value}]`, the IDF-weighted bag of the token
    ids the embed route reads (every window of a long text), unit length. Score a hybrid as
    `(1 - w) * cosine of the /embed vectors + w * dot of these`. A 424 when the bundle has no
    lexical table (GET /info `sparse`)."""
    return json_response(await unless_disconnected(request.receive, tei_embed_sparse_result(body, engine)))


@inference.post("/rerank", response_model=list[TEIRank],
                responses=_TEI_ERRORS | _errors("no_lexical_table", model=TEIErrorResponse),
                summary="Rerank texts for a query (TEI's; bi-encoder cosine)")
async def rerank(body: TEIRerankRequest, request: Request, engine: EngineDep) -> Response:
    """TEI's `POST /rerank`: `[{index, score[, text]}]`, best first, for every text. The score is
    the cosine of the query's and the text's served vectors (a bi-encoder ranking, the vectors
    /embed sends), not a cross-encoder's: GET /info `rerank` says so. With `hybrid` w (or the
    server's rerank_hybrid), the hybrid score of /similarity's `hybrid`; a 424 when the bundle has
    no lexical table. Up to max_texts_per_request texts (TEI's max_client_batch_size)."""
    return json_response(await unless_disconnected(request.receive, rerank_result(body, engine)))


@inference.post("/v1/rerank", response_model=CohereRerankResponse,
                responses=_errors("not_found", "no_lexical_table"),
                summary="Cohere/Jina-compatible rerank (bi-encoder cosine)")
async def cohere_rerank(body: CohereRerankRequest, request: Request, engine: EngineDep) -> Response:
    """Cohere's and Jina's `POST /v1/rerank`: `documents` (strings or `{text}`), `top_n`,
    `return_documents` (default true) -> `{id, model, results: [{index, relevance_score[,
    document]}], usage}`, best first. `relevance_score` is the cosine of the served vectors (in
    [-1, 1], not Cohere's calibrated [0, 1]); `hybrid` as on /rerank."""
    return json_response(await unless_disconnected(request.receive, cohere_rerank_result(body, engine)))


@inference.post("/v2/rerank", response_model=CohereRerankResponse,
                responses=_errors("not_found", "no_lexical_table"),
                summary="Cohere v2 rerank (as /v1/rerank)")
async def cohere_rerank_v2(body: CohereRerankRequest, request: Request, engine: EngineDep) -> Response:
    """Cohere's v2 `POST /v2/rerank` (its ClientV2): answered as /v1/rerank."""
    return json_response(await unless_disconnected(request.receive, cohere_rerank_result(body, engine)))


@inference.post("/predict", response_model=list[TEIPrediction] | list[list[TEIPrediction]],
                responses=_TEI_ERRORS, summary="Classification in TEI's shape (sentiment; NLI for pairs)")
async def predict(body: TEIPredictRequest, request: Request, engine: EngineDep) -> Response:
    """TEI's `POST /predict`: a text -> the sentiment model's classes, a pair [premise, hypothesis]
    -> the NLI model's, each `[{label, score}]` most probable first; a batch -> a list of them."""
    return json_response(await unless_disconnected(request.receive, predict_result(body, engine)))


@inference.post("/nli", response_model=NLIResponse, summary="Natural language inference")
async def nli(body: NLIRequest, request: Request, engine: EngineDep) -> Response:
    """Entailment / neutral / contradiction for each premise-hypothesis pair."""
    return json_response(await unless_disconnected(request.receive, nli_result(body, engine)))


@inference.post("/sentiment", response_model=SentimentResponse, response_model_exclude_none=True,
                summary="Sentiment (5 SST classes + coarse polarity)")
async def sentiment(body: SentimentRequest, request: Request, engine: EngineDep) -> Response:
    """Fine-grained sentiment per text; `explain=true` adds attention maps and token weights."""
    return json_response(await unless_disconnected(request.receive, sentiment_result(body, engine)))


@inference.post("/v1/embeddings", response_model=OpenAIEmbeddingsResponse,
                responses=_errors("not_found"), summary="OpenAI-compatible embeddings")
async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request,
                            engine: EngineDep) -> Response:
    """OpenAI `POST /v1/embeddings`: up to `openai_max_inputs` inputs (2,048), vectors
    L2-normalised like OpenAI's, `base64` is little-endian float32. Inputs of any length are
    embedded: over `max_tokens` in windows whose vectors are pooled (`usage.windowed_inputs`; the
    server's `openai_long_text` may say truncate or error instead). Any `model` name is answered
    by the served model, named in the response; with `openai_strict_model` an unknown one is a 404
    with OpenAI's `param` and `code` (`model_not_found`)."""
    return json_response(await unless_disconnected(request.receive,
                                                   openai_embeddings_result(body, engine)))


@inference.get("/v1/models", response_model=OpenAIModelList, summary="OpenAI-compatible model list")
async def openai_models(engine: EngineDep) -> dict:
    """The served model and the aliases /v1 accepts as `model`."""
    return models_result(engine)


@inference.get("/v1/models/{model}", response_model=OpenAIModel, responses=_errors("not_found"),
               summary="One model (OpenAI-compatible)")
async def openai_model(model: str, engine: EngineDep) -> dict:
    """One entry of `GET /v1/models`, or 404 `model_not_found` (the list is what is served,
    whatever names /v1/embeddings answers to)."""
    check_model(engine, model, strict=True)
    return next(m for m in models_result(engine)["data"] if m["id"] == model)


@inference.post("/tokenize", response_model=TokenizeResponse | list[list[TEISimpleToken]],
                responses=_EITHER_ERRORS, summary="The model's tokens (ours, or TEI's body)")
async def tokenize(body: TOKENIZE_BODY, request: Request, engine: EngineDep) -> Response:
    """Tokens and vocabulary ids as the model sees them, and whether each text is over
    `max_tokens` (our tokens are not tiktoken's: chunk long documents with these counts).
    A body with `inputs` is TEI's: per text, TEI's token objects `{id, text, special, start, stop}`."""
    _family(request, body)
    return json_response(await unless_disconnected(request.receive, tokenize_any(body, engine)))


@inference.post("/decode", response_model=list[str], responses=_TEI_ERRORS,
                summary="Token ids back to text (TEI's)")
async def decode(body: TEIDecodeRequest, request: Request, engine: EngineDep) -> Response:
    """TEI's `POST /decode`: `ids`, the embed route's token ids (POST /tokenize's `id`), one
    sequence or a batch of them -> the text of each, as the tokenizer joins its pieces (lower case:
    the model reads lower case). An id the tokenizer lacks is a 422 naming it."""
    return json_response(await unless_disconnected(request.receive, tei_decode_result(body, engine)))


@inference.post("/similarity", response_model=SimilarityResponse | list[float],
                response_model_exclude_none=True, responses=_EITHER_ERRORS | _errors("no_lexical_table"),
                summary="Cosine similarity of sentences (ours, or TEI's body)")
async def similarity(body: SIMILARITY_BODY, request: Request, engine: EngineDep) -> Response:
    """`pairs` -> a cosine per pair; `query` + `texts` -> texts ranked by cosine (best first,
    `top_k` keeps the best k); `texts` alone -> the matrix of all pairs. TEI's body (`inputs`:
    {source_sentence, sentences}, optional `parameters`) -> a bare list of cosines, in order."""
    _family(request, body)
    return json_response(await unless_disconnected(request.receive, similarity_any(body, engine)))


def model_configs(manifest: dict) -> dict[str, dict]:
    """{model: its config} of the models the manifest lists."""
    return {task: (v.get("config") or {}) for task, v in (manifest.get("models") or {}).items()
            if isinstance(v, dict)}


def borrowed_words(manifest: dict) -> dict[str, int]:
    """{model: how many words past its own table it reads through the embedding encoder's table}
    for the models that borrow them (`disan borrow-words`); the others read those words as UNK."""
    configs = model_configs(manifest)
    # a piece encoder's borrowed rows (its whole words) sit past its pieces, not in the bundle vocabulary
    return {task: int(c["borrowed_rows"]) - int(c["vocab_size"]) for task, c in configs.items()
            if c.get("borrowed_rows") and not c.get("borrowed_offset")}


def ensemble_members(manifest: dict) -> dict[str, int]:
    """{model: how many models it averages} for the ensembles (`disan ensemble`); single models
    are left out."""
    counts = {task: int(c.get("members") or 1) for task, c in model_configs(manifest).items()}
    return {task: n for task, n in counts.items() if n > 1}


def sources(manifest: dict) -> dict[str, dict[str, str]]:
    """{model: {file, sha256}}: the checkpoint each model was exported from, which names the
    weights being served (their history is the manifest's `sources` and `lineage`)."""
    return {task: {k: str(s[k]) for k in ("file", "sha256") if k in s}
            for task, s in (manifest.get("sources") or {}).items() if isinstance(s, dict)}


@inference.get("/info", response_model=Info, summary="Model, provider in use, limits")
async def info(engine: EngineDep) -> dict:
    """What is being served and how: the provider is the one the live session reports."""
    rt = engine.require_ready()
    s = engine.settings
    m = rt.manifest
    return {
        **tei_info(engine),
        "model": rt.name, "dim": rt.dim, "matryoshka_dims": matryoshka_dims(m, rt.dim),
        "dimensions_by": "prefix" if rt.projection is None else "principal_axes",
        "dimensions_up_to": any_size_up_to(m),
        "sparse": {"served": rt.idf is not None, "route": "/embed_sparse", "weighting": WEIGHTING},
        "provider": rt.provider, "providers": rt.providers,
        "variant": rt.variant, "labels": rt.labels, "explain": rt.has_explain, "routes": rt.routes,
        "limits": {"max_texts_per_request": s.max_texts_per_request,
                   "max_chars_per_text": s.max_chars_per_text, "max_tokens": rt.max_tokens,
                   "max_request_bytes": s.max_request_bytes, "queue_limit": s.queue_limit,
                   "max_explain_texts": s.max_explain_texts, "max_explain_tokens": s.max_explain_tokens,
                   "max_concurrent_requests": s.max_concurrent_requests,
                   "max_json_items": s.max_json_items, "max_header_bytes": s.max_header_bytes,
                   "window_overlap": s.window_overlap, "max_tokens_per_text": s.max_tokens_per_text,
                   "max_tokens_per_request": s.max_tokens_per_request},
        "batching": {"max_batch_size": engine.batching.max_batch_size, "max_wait_ms": s.max_wait_ms,
                     "max_batch_cells": engine.batching.max_batch_cells,
                     "batch_concurrency": rt.batch_concurrency, "source": engine.batching.source},
        "metrics": {task: dict(v.get("metrics") or {}) for task, v in (m.get("models") or {}).items()
                    if isinstance(v, dict)},
        "bundle": {**{k: m[k] for k in ("created", "max_len", "format_version", "versions") if k in m},
                   "graph_set": rt.graph_set, "borrowed_words": borrowed_words(m),
                   "ensemble_members": ensemble_members(m), "sources": sources(m),
                   "route_fingerprints": fingerprints_in_use(m, rt.graph_set, rt.variant)},
    }


@router.get("/health", response_model=Status, response_model_exclude_none=True,
            responses={503: {"model": Status}}, summary="Liveness")
async def health(engine: EngineDep) -> Any:
    """200 while the process is alive; 503 only if the bundle failed to load (restart me)."""
    if engine.state == "failed":
        return JSONResponse({"status": "failed", "detail": engine.detail}, status_code=503)
    return {"status": "ok"}


@router.get("/ready", response_model=Status, response_model_exclude_none=True,
            responses={503: {"model": Status}}, summary="Readiness")
async def ready(engine: EngineDep) -> Any:
    """200 once the bundle is loaded and warmed up (in every worker process); 503 while loading,
    draining or failed."""
    state, detail = engine.readiness()
    if state != "ready":
        return JSONResponse({"status": state, "detail": detail}, status_code=503,
                            headers={"Retry-After": "1"})
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    """Prometheus text exposition format."""
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
