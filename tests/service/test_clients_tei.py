"""Clients written for Hugging Face text-embeddings-inference (TEI) and for Cohere's / Jina's
rerank, each with its defaults (base URL set, nothing else), against a live server with its
defaults: `huggingface_hub.InferenceClient` (`feature_extraction`, `sentence_similarity`),
LlamaIndex's `TextEmbeddingsInference` and its TEI reranker, the `cohere` SDK's `rerank` (v1 and
v2). Vectors through TEI's routes must equal /embed's (cosine >= 0.9999); rankings must be the
cosine ranking /similarity gives, or its hybrid ranking where the server sets `rerank_hybrid` (the
clients cannot send `hybrid`).

Each test skips with its reason when its client is not installed (they come with the `clients`
extra).
"""

from __future__ import annotations

import asyncio
import importlib

import httpx
import numpy as np
import pytest
from support_serving import serve_in_thread
from test_clients import chunks, documents, reference

from service.settings import Settings

QUERY = "a man is playing the guitar"
HYBRID = 0.5


@pytest.fixture(scope="module")
def server(tiny_bundle):
    with serve_in_thread(Settings(bundle=tiny_bundle)) as base:  # the server's defaults too
        yield base


@pytest.fixture(scope="module")
def hybrid_server(sparse_bundle):
    with serve_in_thread(Settings(bundle=sparse_bundle, rerank_hybrid=HYBRID)) as base:
        yield base


def client_package(name: str):
    return pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[clients]')")


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub as a user has it: online. Loading the teacher models sets HF_HUB_OFFLINE in
    this process (disan.train.word_vectors), and the hub reads it once, at import, into a constant
    that then refuses every request, even to this local server."""
    package = client_package("huggingface_hub")
    monkeypatch.setattr(importlib.import_module("huggingface_hub.constants"), "HF_HUB_OFFLINE", False)
    return package


def assert_same_vectors(got, expected) -> None:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape
    cos = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cos.min() >= 0.9999, cos


def ranking(server: str, query: str, texts: list[str], hybrid: float = 0.0) -> tuple[list[int], list[float]]:
    """(indices best first, their cosines or hybrid scores) as our own /similarity ranks them."""
    body = {"query": query, "texts": texts, "hybrid": hybrid}
    r = httpx.post(f"{server}/similarity", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return [x["index"] for x in r.json()["ranking"]], [x["score"] for x in r.json()["ranking"]]


def test_huggingface_hub_inference_client(server, hub):
    client = hub.InferenceClient(base_url=server)
    texts = documents(5)
    one = client.feature_extraction(texts[0])
    assert one.dtype == np.float32 and one.shape == (1, 16)
    assert_same_vectors(one, reference(server, texts[:1]))
    assert_same_vectors(client.feature_extraction(texts), reference(server, texts))
    long = chunks(2, 300, 600)  # over the 128-token window: windowed, as /embed does
    assert_same_vectors(client.feature_extraction(long), reference(server, long))
    scores = client.sentence_similarity(QUERY, other_sentences=texts)
    vectors = reference(server, [QUERY, *texts])
    np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], atol=1e-5)


def test_huggingface_hub_async_client(server, hub):
    texts = documents(12)

    async def main():
        client = hub.AsyncInferenceClient(base_url=server)
        return await asyncio.gather(*(client.feature_extraction(t) for t in texts))

    assert_same_vectors(np.concatenate(asyncio.run(main())), reference(server, texts))


def test_llama_index_text_embeddings_inference(server):
    tei = client_package("llama_index.embeddings.text_embeddings_inference")
    embedding = tei.TextEmbeddingsInference(model_name="any", base_url=server)
    assert embedding.truncate_text and embedding.endpoint == "/embed"  # the defaults, untouched
    docs = documents(15) + chunks(2, 200, 400)  # embed_batch_size 10: two calls
    batch = embedding.get_text_embedding_batch(docs)
    assert_same_vectors(batch[:15], reference(server, docs[:15]))
    # truncate=true (its default) keeps a long text's first 128 tokens, as /embed's long_text=truncate
    r = httpx.post(f"{server}/embed", json={"texts": docs[15:], "normalize": True, "long_text": "truncate"})
    assert_same_vectors(batch[15:], r.json()["embeddings"])
    assert_same_vectors([embedding.get_query_embedding(QUERY)], reference(server, [QUERY]))
    assert_same_vectors([asyncio.run(embedding.aget_text_embedding(docs[0]))], reference(server, docs[:1]))


def test_llama_index_tei_reranker(server):
    rerank = client_package("llama_index.postprocessor.tei_rerank")
    schema = client_package("llama_index.core.schema")
    texts = documents(8)
    nodes = [schema.NodeWithScore(node=schema.TextNode(text=t), score=0.0) for t in texts]
    reranker = rerank.TextEmbeddingInference(base_url=server)
    assert reranker.top_n == 5
    kept = reranker.postprocess_nodes(nodes, query_str=QUERY)
    order, scores = ranking(server, QUERY, texts)
    assert [n.node.get_content() for n in kept] == [texts[i] for i in order[:5]]
    np.testing.assert_allclose([n.score for n in kept], scores[:5], atol=1e-5)


def test_cohere_sdk_rerank(server):
    cohere = client_package("cohere")
    texts = documents(8)
    order, scores = ranking(server, QUERY, texts)
    client = cohere.Client(base_url=server, api_key="unused")
    answer = client.rerank(query=QUERY, documents=texts, top_n=3)
    assert [r.index for r in answer.results] == order[:3]
    np.testing.assert_allclose([r.relevance_score for r in answer.results], scores[:3], atol=1e-5)
    every = client.rerank(query=QUERY, documents=[{"text": t} for t in texts])
    assert [r.index for r in every.results] == order
    v2 = cohere.ClientV2(base_url=server, api_key="unused")
    answer = v2.rerank(model="rerank-v3.5", query=QUERY, documents=texts, top_n=2)
    assert [r.index for r in answer.results] == order[:2]


def test_stock_rerank_clients_get_the_servers_hybrid_score(hybrid_server):
    texts = documents(8)
    order, scores = ranking(hybrid_server, QUERY, texts, HYBRID)
    assert (order, scores) != ranking(hybrid_server, QUERY, texts)  # the hybrid score is not the cosine
    rerank = client_package("llama_index.postprocessor.tei_rerank")
    schema = client_package("llama_index.core.schema")
    nodes = [schema.NodeWithScore(node=schema.TextNode(text=t), score=0.0) for t in texts]
    kept = rerank.TextEmbeddingInference(base_url=hybrid_server).postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.get_content() for n in kept] == [texts[i] for i in order[:5]]
    np.testing.assert_allclose([n.score for n in kept], scores[:5], atol=1e-5)
    cohere = client_package("cohere")
    answer = cohere.Client(base_url=hybrid_server, api_key="unused").rerank(query=QUERY, documents=texts)
    assert [r.index for r in answer.results] == order
    np.testing.assert_allclose([r.relevance_score for r in answer.results], scores, atol=1e-5)
