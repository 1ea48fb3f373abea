"""The inference routes' table, both families: path -> (request body, handler), which the fast path
(service.http.fastpath) serves and whose paths pass admission control (service.http.asgi).

On the routes both families share, the body's keys pick the handler (service.http.tei_schemas):
ours answers our body, service.http.tei TEI's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from service.http.handlers import (
    embed_result,
    nli_result,
    openai_embeddings_result,
    sentiment_result,
    similarity_result,
    tokenize_result,
)
from service.http.openai_schemas import OpenAIEmbeddingsRequest
from service.http.schemas import NLIRequest, SentimentRequest
from service.http.tei import (
    cohere_rerank_result,
    predict_result,
    rerank_result,
    tei_decode_result,
    tei_embed_result,
    tei_embed_sparse_result,
    tei_similarity_result,
    tei_tokenize_result,
)
from service.http.tei_schemas import (
    EMBED_BODY,
    ROOT_BODY,
    SIMILARITY_BODY,
    TOKENIZE_BODY,
    CohereRerankRequest,
    OneOf,
    TEIDecodeRequest,
    TEIEmbedRequest,
    TEIEmbedSparseRequest,
    TEIPredictRequest,
    TEIRerankRequest,
    TEISimilarityRequest,
    TEITokenizeRequest,
)
from service.inference.engine import Engine

Handler = Callable[[Any, Engine], Awaitable[Any]]


def either(tei_model: type, tei: Handler, ours: Handler) -> Handler:
    """The handler of a route both families share: TEI's for a TEI body, ours otherwise."""
    async def handle(body: Any, engine: Engine) -> Any:
        return await (tei if isinstance(body, tei_model) else ours)(body, engine)
    return handle


embed_any = either(TEIEmbedRequest, tei_embed_result, embed_result)
similarity_any = either(TEISimilarityRequest, tei_similarity_result, similarity_result)
tokenize_any = either(TEITokenizeRequest, tei_tokenize_result, tokenize_result)
# POST / is TEI's only: its embed, or its similarity (service.http.tei_schemas.ROOT_BODY).
root_any = either(TEISimilarityRequest, tei_similarity_result, tei_embed_result)

HANDLERS: dict[str, tuple[Any, Handler]] = {
    "/": (OneOf(ROOT_BODY), root_any),
    "/embed": (OneOf(EMBED_BODY), embed_any),
    "/nli": (NLIRequest, nli_result),
    "/sentiment": (SentimentRequest, sentiment_result),
    "/v1/embeddings": (OpenAIEmbeddingsRequest, openai_embeddings_result),
    "/tokenize": (OneOf(TOKENIZE_BODY), tokenize_any),
    "/decode": (TEIDecodeRequest, tei_decode_result),
    "/similarity": (OneOf(SIMILARITY_BODY), similarity_any),
    "/embed_sparse": (TEIEmbedSparseRequest, tei_embed_sparse_result),
    "/rerank": (TEIRerankRequest, rerank_result),
    "/predict": (TEIPredictRequest, predict_result),
    "/v1/rerank": (CohereRerankRequest, cohere_rerank_result),
    "/v2/rerank": (CohereRerankRequest, cohere_rerank_result),
}
