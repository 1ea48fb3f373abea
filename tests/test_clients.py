"""The clients people plug an embedding server into, against a live server on 127.0.0.1:
`openai`, LangChain's `OpenAIEmbeddings` (default chunk_size) and LlamaIndex's `OpenAIEmbedding`.

Each test skips when its client is not installed (they come with the dev extra).
"""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import pytest
from conftest import serve_in_thread

from service.settings import Settings

# LangChain's and LlamaIndex's default model name, accepted here as an alias of the served model.
ADA = "text-embedding-ada-002"
WORDS = "a man woman dog is playing running the guitar park movie was great bad".split()


def documents(n: int) -> list[str]:
    return [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 7)) for i in range(n)]


@pytest.fixture(scope="module")
def server(tiny_bundle):
    with serve_in_thread(Settings(bundle=tiny_bundle, model_aliases=[ADA])) as base:
        yield base


@pytest.fixture(scope="module")
def name(server) -> str:
    return httpx.get(f"{server}/v1/models").json()["data"][0]["id"]


def reference(server: str, texts: list[str]) -> np.ndarray:
    """The same texts through /embed (normalised), to check what the clients decode."""
    r = httpx.post(f"{server}/embed", json={"texts": texts, "normalize": True}, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"])


def test_openai_client_string_list_base64_models_and_errors(server, name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    texts = documents(5)
    ref = reference(server, texts)
    one = client.embeddings.create(model=name, input=texts[0])
    np.testing.assert_allclose(one.data[0].embedding, ref[0], atol=1e-6)
    assert one.usage.prompt_tokens == len(texts[0].split())
    many = client.embeddings.create(model=name, input=texts)
    np.testing.assert_allclose([d.embedding for d in many.data], ref, atol=1e-6)
    raw = client.embeddings.create(model=name, input=texts, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data]
    np.testing.assert_allclose(decoded, ref, atol=1e-6)
    assert [m.id for m in client.models.list()] == [name, ADA]
    assert client.models.retrieve(ADA).id == ADA

    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="gpt-4o", input="a man")
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.UnprocessableEntityError) as ids:
        client.embeddings.create(model=name, input=[[1, 2, 3]])
    assert "check_embedding_ctx_length=False" in str(ids.value)


def test_openai_async_client_under_concurrency(server, name):
    openai = pytest.importorskip("openai")
    texts = documents(40)
    ref = reference(server, texts)

    async def main() -> list:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(client.embeddings.create(model=name, input=t) for t in texts))

    answers = asyncio.run(main())
    np.testing.assert_allclose([a.data[0].embedding for a in answers], ref, atol=1e-6)


def test_langchain_default_chunk_size_embeds_300_documents(server, name):
    """OpenAIEmbeddings sends chunk_size=1,000 inputs per call by default (300 in one call here)."""
    langchain_openai = pytest.importorskip("langchain_openai")
    embeddings = langchain_openai.OpenAIEmbeddings(model=name, base_url=f"{server}/v1", api_key="unused",
                                                   check_embedding_ctx_length=False, max_retries=0)
    assert embeddings.chunk_size == 1000  # the default, untouched
    docs = documents(300)
    vectors = np.asarray(embeddings.embed_documents(docs))
    assert vectors.shape[0] == 300
    np.testing.assert_allclose(vectors[:3], reference(server, docs[:3]), atol=1e-6)
    np.testing.assert_allclose(vectors[-2:], reference(server, docs[-2:]), atol=1e-6)
    np.testing.assert_allclose(embeddings.embed_query(docs[7]), vectors[7], atol=1e-6)


def test_langchain_default_tiktoken_path_gets_the_clear_422(server, monkeypatch):
    """With its defaults LangChain tokenizes with tiktoken and sends token-id arrays, which this
    server cannot read: the answer must tell the user what to set.

    tiktoken downloads its BPE files from the internet at first use, and this machine is offline
    (LangChain then fails with a ConnectionError before any request). So the test hands tiktoken
    a local byte-level encoding: the same LangChain code path, with other ids.
    """
    langchain_openai = pytest.importorskip("langchain_openai")
    tiktoken = pytest.importorskip("tiktoken")
    openai = pytest.importorskip("openai")
    local = tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+", special_tokens={},
                              mergeable_ranks={bytes([i]): i for i in range(256)})
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda _name: local)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda _name: local)
    embeddings = langchain_openai.OpenAIEmbeddings(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    assert embeddings.model == ADA and embeddings.check_embedding_ctx_length and embeddings.tiktoken_enabled
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        embeddings.embed_documents(documents(3))
    assert "token-id arrays are not supported" in str(refused.value)
    assert "check_embedding_ctx_length=False" in str(refused.value)


def test_llama_index_openai_embedding(server, name):
    li = pytest.importorskip("llama_index.embeddings.openai")
    docs = documents(150)  # embed_batch_size 100: two calls
    ref = reference(server, docs[:4])
    # the served name (model_name= is how LlamaIndex takes a model outside OpenAI's list) ...
    ours = li.OpenAIEmbedding(model_name=name, api_base=f"{server}/v1", api_key="unused", max_retries=0)
    np.testing.assert_allclose(ours.get_text_embedding(docs[0]), ref[0], atol=1e-6)
    np.testing.assert_allclose(ours.get_query_embedding(docs[1]), ref[1], atol=1e-6)
    batch = np.asarray(ours.get_text_embedding_batch(docs))
    assert batch.shape[0] == 150
    np.testing.assert_allclose(batch[:4], ref, atol=1e-6)
    # ... or its default model name, answered through the server's model_aliases
    default = li.OpenAIEmbedding(api_base=f"{server}/v1", api_key="unused", max_retries=0)
    assert default.model_name == ADA
    np.testing.assert_allclose(default.get_text_embedding(docs[2]), ref[2], atol=1e-6)
