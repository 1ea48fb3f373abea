"""Handlers of the APIs served beside ours (HTTP-neutral, like service.http.handlers): Hugging Face
text-embeddings-inference's (TEI) and Cohere's / Jina's rerank. Each answers in its family's
shape from the same engine calls as our routes, so the micro-batcher, admission control and the
limits are the same (`max_texts_per_request` is TEI's `max_client_batch_size`).

Rerank here is a bi-encoder ranking: each text's score is the cosine of the query's and the
text's served vectors (the vectors /embed sends), not a cross-encoder's relevance; /info says so
(`rerank`). The query and the texts are queued in the batcher together, one pass as /embed of
them all would take (bench/rerank.py measures both).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np

import disan
from disan.bundle.lexical import hybrid_scores, sparse_dots
from disan.bundle.manifest import fingerprints_in_use
from disan.runtime.encoder import prefixed
from service.common.errors import RequestTooLarge
from service.http.handlers import check_model, cosines, prefix_size, token_count
from service.http.tei_schemas import (
    CohereRerankRequest,
    TEIDecodeRequest,
    TEIEmbedRequest,
    TEIEmbedSparseRequest,
    TEIPredictRequest,
    TEIRerankRequest,
    TEISimilarityParameters,
    TEISimilarityRequest,
    TEITokenizeRequest,
)
from service.inference.engine import Engine
from service.inference.longtext import TRUNCATE_LEFT, OneText, check_chars
from service.inference.tokenizing import decode_ids, embed_sparse, require_idf, sparse_of, tokenize_only

# What /info says about /rerank, /v1/rerank and /v2/rerank (and the docs).
RERANK_METHOD = ("bi-encoder: each text's score is the cosine of the query's and the text's "
                 "served vectors (the vectors /embed sends), not a cross-encoder's relevance; with a "
                 "hybrid weight w, (1 - w) x that cosine + w x their sparse vectors' dot product")
# TEI's model_dtype for the graph variants.
_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}
# The log of a class probability of 0 (raw_scores): JSON has no -inf.
_TINY = 1e-38


def tei_policy(engine: Engine, truncate: bool | None, direction: str) -> str:
    """The long-text policy of a TEI request: truncate=true cuts (keeping the end for
    truncation_direction=left); otherwise the server's long_text (window by default)."""
    if truncate:
        return TRUNCATE_LEFT if direction.lower() == "left" else "truncate"
    return engine.settings.long_text


def _texts(inputs: str | list[str]) -> tuple[list[str], str]:
    """(texts, field for errors) of TEI's `inputs`, a string or a list of strings."""
    return ([inputs], OneText("inputs")) if isinstance(inputs, str) else (inputs, "inputs")


async def tei_embed_result(body: TEIEmbedRequest, engine: Engine) -> np.ndarray:
    """TEI's POST /embed (and POST /): a bare list of vectors, one per input (a single string too)."""
    texts, field = _texts(body.inputs)
    size = prefix_size(engine, body.dimensions)
    normalize = body.normalize and size is None  # a prefix is normalised once cut
    vectors, _ = await engine.embed(texts, normalize, tei_policy(engine, body.truncate,
                                                                 body.truncation_direction), field)
    projection = engine.require_ready().projection
    return prefixed(vectors, size, body.normalize, projection) if size is not None else vectors


async def tei_embed_sparse_result(body: TEIEmbedSparseRequest, engine: Engine) -> list[list[dict[str, Any]]]:
    """TEI's POST /embed_sparse: per input its sparse lexical vector, [{index, value}] by index
    (disan.bundle.lexical); a 424 when the bundle has no lexical table, as TEI answers for a model
    that is not a sparse one."""
    texts, field = _texts(body.inputs)
    policy = tei_policy(engine, body.truncate, body.truncation_direction)
    vectors = await embed_sparse(engine, texts, policy, field)
    return [[{"index": i, "value": v} for i, v in zip(idx.tolist(), val.tolist(), strict=True)]
            for idx, val in vectors]


async def tei_similarity_result(body: TEISimilarityRequest, engine: Engine) -> list[float]:
    """TEI's POST /similarity: the cosine of each sentence with source_sentence, in order."""
    params = body.parameters or TEISimilarityParameters()
    policy = tei_policy(engine, params.truncate, params.truncation_direction)
    (source, _), (others, _) = await engine.embed_together(
        [([body.inputs.source_sentence], OneText("inputs.source_sentence")),
         (body.inputs.sentences, "inputs.sentences")], policy)
    return cosines(others @ source[0]).tolist()


def _offsets(text: str, tokens: list[str]) -> list[tuple[int | None, int | None]]:
    """Where each token is in `text`, found left to right as it is (lowercase); (None, None) where
    it is not there as such (a spelling correction, a rewritten quote)."""
    lowered, cursor, out = text.lower(), 0, []
    for token in tokens:
        at = lowered.find(token, cursor)
        if at < 0:
            out.append((None, None))
        else:
            cursor = at + len(token)
            out.append((at, cursor))
    return out


async def tei_tokenize_result(body: TEITokenizeRequest, engine: Engine) -> list[list[dict[str, Any]]]:
    """TEI's POST /tokenize: per text, its tokens as TEI's SimpleToken objects."""
    texts, field = _texts(body.inputs)
    items = await tokenize_only(engine, texts, field)
    return [[{"id": i, "text": tok, "special": False, "start": start, "stop": stop}
             for i, tok, (start, stop) in zip(item.ids, item.tokens, _offsets(text, item.tokens),
                                              strict=True)]
            for text, item in zip(texts, items, strict=True)]


async def tei_decode_result(body: TEIDecodeRequest, engine: Engine) -> list[str]:
    """TEI's POST /decode: the text of each id sequence (a single sequence too: a list of one)."""
    ids = body.ids
    sequences = ids if isinstance(ids[0], list) else [ids]
    return await decode_ids(engine, sequences, body.skip_special_tokens)  # type: ignore[arg-type]


async def ranking(engine: Engine, query: str, texts: list[str], field: str, policy: str,
                  hybrid: float | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(indices best first, score per text, tokens) of `texts` against `query`: both embedded in
    one pass through the batcher, normalised, scored by their dot product; mixed with the sparse
    vectors' (from the same tokens) at `hybrid`, or the server's rerank_hybrid when it is None."""
    weight = engine.settings.rerank_hybrid if hybrid is None else hybrid
    if weight:
        require_idf(engine)  # 424 before any work
    (q, q_items), (docs, d_items) = await engine.embed_together(
        [([query], OneText("query")), (texts, field)], policy)
    sparse = await sparse_of(engine, q_items + d_items) if weight else []  # the query's, then the texts'
    scores = hybrid_scores(cosines(docs @ q[0]), weight, lambda: sparse_dots(sparse[:1], sparse[1:])[0])
    return np.argsort(-scores, kind="stable"), scores, token_count(q_items) + token_count(d_items)


async def rerank_result(body: TEIRerankRequest, engine: Engine) -> list[dict[str, Any]]:
    """TEI's POST /rerank: [{index, score[, text]}] best first (score: module docstring)."""
    policy = tei_policy(engine, body.truncate, body.truncation_direction)
    order, scores, _ = await ranking(engine, body.query, body.texts, "texts", policy, body.hybrid)
    if body.return_text:
        return [{"index": int(i), "score": float(scores[i]), "text": body.texts[i]} for i in order]
    return [{"index": int(i), "score": float(scores[i])} for i in order]


async def cohere_rerank_result(body: CohereRerankRequest, engine: Engine) -> dict[str, Any]:
    """Cohere's / Jina's POST /v1/rerank (and Cohere's /v2/rerank): results best first, `top_n`
    of them, each {index, relevance_score[, document: {text}]}."""
    check_model(engine, body.model)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    order, scores, tokens = await ranking(engine, body.query, texts, "documents", engine.settings.long_text,
                                          body.hybrid)
    results = [{"index": int(i), "relevance_score": float(scores[i]),
                **({"document": {"text": texts[i]}} if body.return_documents else {})}
               for i in order[: body.top_n]]
    return {"id": str(uuid.uuid4()), "model": engine.require_ready().name, "results": results,
            "usage": {"total_tokens": tokens}}


def _predictions(scores: dict[str, float], raw: bool) -> list[dict[str, Any]]:
    """TEI's predictions of one input: every class, most probable first."""
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return [{"label": label, "score": math.log(max(p, _TINY)) if raw else p} for label, p in ranked]


async def predict_result(body: TEIPredictRequest, engine: Engine) -> list:
    """TEI's POST /predict: single texts through the sentiment model, pairs [premise, hypothesis]
    through the NLI model; a single input gets its predictions, a batch a list of them."""
    inputs = body.inputs
    single = isinstance(inputs, str) or all(isinstance(v, str) for v in inputs)
    batch: list[list[str]] = [[inputs]] if isinstance(inputs, str) else [inputs] if single else inputs
    limit = engine.settings.max_texts_per_request
    if len(batch) > limit:
        raise RequestTooLarge(f"inputs: {len(batch)} items, at most {limit} per request")
    for i, sequence in enumerate(batch):  # errors name inputs[i][j], before any tokenizing
        check_chars(sequence, "inputs" if single else f"inputs[{i}]", "", engine.settings.max_chars_per_text)
    policy = tei_policy(engine, body.truncate, body.truncation_direction)
    ones = [i for i, s in enumerate(batch) if len(s) == 1]
    twos = [i for i, s in enumerate(batch) if len(s) == 2]
    out: list[Any] = [None] * len(batch)
    if ones:
        results, _ = await engine.sentiment([batch[i][0] for i in ones], policy, False)
        for i, r in zip(ones, results, strict=True):
            out[i] = _predictions(r["scores"], body.raw_scores)
    if twos:
        results, _ = await engine.nli([(batch[i][0], batch[i][1]) for i in twos], policy)
        for i, r in zip(twos, results, strict=True):
            out[i] = _predictions(r["scores"], body.raw_scores)
    return out[0] if single else out


def tei_info(engine: Engine) -> dict[str, Any]:
    """TEI's fields of GET /info (model_id, max_input_length, max_client_batch_size, ...)."""
    rt = engine.require_ready()
    s = engine.settings
    return {
        "model_id": rt.name, "served_model_name": rt.name,
        "model_sha": fingerprints_in_use(rt.manifest, rt.graph_set, rt.variant).get("embed"),
        "model_dtype": _DTYPES.get(rt.variant, rt.variant),
        "model_type": {"embedding": {"pooling": "source2token"}},
        "max_concurrent_requests": s.max_concurrent_requests, "max_input_length": rt.max_tokens,
        "max_batch_tokens": engine.batching.max_batch_size * rt.max_tokens if engine.batching else 0,
        "max_batch_requests": None, "max_client_batch_size": s.max_texts_per_request,
        "auto_truncate": s.long_text != "error", "tokenization_workers": 1,
        "version": disan.__version__, "sha": None, "docker_label": None,
        "rerank": {"method": RERANK_METHOD, "routes": ["/rerank", "/v1/rerank", "/v2/rerank"],
                   "hybrid": s.rerank_hybrid},
    }
