"""The clients people plug an embedding server into, against a live server on 127.0.0.1 run with
its defaults, each client with its defaults (base URL and key set, nothing else): `openai` (sync
and async, float and base64), LangChain's `OpenAIEmbeddings`, LlamaIndex's `OpenAIEmbedding` and
`OpenAILikeEmbedding`. More clients: tests/service/test_clients_more.py.

Each test skips when its client is not installed (they come with the dev extra).
"""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import pytest
from support_serving import serve_in_thread

from service.settings import Settings

# LangChain's and LlamaIndex's default model name: any name is answered by the served model.
ADA = "text-embedding-ada-002"
WORDS = "a man woman dog is playing running the guitar park movie was great bad".split()


def documents(n: int) -> list[str]:
    return [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 7)) for i in range(n)]


def chunks(n: int, lo: int = 20, hi: int = 1500, seed: int = 0) -> list[str]:
    """`n` text-splitter chunks of `lo`-`hi` tokens (one word = one token here)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi + 1)))) for _ in range(n)]


@pytest.fixture(scope="module")
def server(tiny_bundle):
    with serve_in_thread(Settings(bundle=tiny_bundle)) as base:  # the server's defaults too
        yield base


@pytest.fixture(scope="module")
def name(server) -> str:
    return httpx.get(f"{server}/v1/models").json()["data"][0]["id"]


def reference(server: str, texts: list[str]) -> np.ndarray:
    """The same texts through /embed (normalised), to check what the clients decode."""
    r = httpx.post(f"{server}/embed", json={"texts": texts, "normalize": True}, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"])


def test_openai_client_string_list_base64_long_texts_and_errors(server, name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    texts = documents(4) + chunks(2, 300, 600)  # two over the 128-token window
    ref = reference(server, texts)
    one = client.embeddings.create(model="text-embedding-3-small", input=texts[0])
    assert one.model == name  # the model that answered
    np.testing.assert_allclose(one.data[0].embedding, ref[0], atol=1e-6)
    assert one.usage.prompt_tokens == len(texts[0].split())
    many = client.embeddings.create(model=ADA, input=texts)
    np.testing.assert_allclose([d.embedding for d in many.data], ref, atol=1e-6)
    assert many.usage.prompt_tokens == sum(len(t.split()) for t in texts)
    raw = client.embeddings.create(model=ADA, input=texts, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data]
    np.testing.assert_allclose(decoded, ref, atol=1e-6)
    assert [m.id for m in client.models.list()] == [name]

    with pytest.raises(openai.UnprocessableEntityError) as ids:
        client.embeddings.create(model=name, input=[[1, 2, 3]])
    assert "check_embedding_ctx_length=False" in str(ids.value)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_async_client_under_concurrency(server, encoding_format):
    openai = pytest.importorskip("openai")
    texts = documents(30) + chunks(10, 130, 900)
    ref = reference(server, texts)

    async def main() -> list:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused") as client:
            return await asyncio.gather(*(client.embeddings.create(model=ADA, input=t,
                                                                   encoding_format=encoding_format)
                                          for t in texts))

    answers = asyncio.run(main())
    got = [a.data[0].embedding for a in answers]
    if encoding_format == "base64":  # the SDK hands base64 back as sent when asked for it
        got = [np.frombuffer(base64.b64decode(e), dtype="<f4") for e in got]
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_langchain_embeds_1000_chunks_of_20_to_1500_tokens(server, name):
    """OpenAIEmbeddings sends chunk_size=1,000 inputs per call by default: 1,000 ordinary chunks in
    one call, most over the 128-token window, all embedded."""
    langchain_openai = pytest.importorskip("langchain_openai")
    embeddings = langchain_openai.OpenAIEmbeddings(base_url=f"{server}/v1", api_key="unused",
                                                   check_embedding_ctx_length=False)
    assert embeddings.chunk_size == 1000 and embeddings.model == ADA  # the defaults, untouched
    docs = chunks(1000)
    vectors = np.asarray(embeddings.embed_documents(docs))
    assert vectors.shape[0] == 1000 and np.isfinite(vectors).all()
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
    embeddings = langchain_openai.OpenAIEmbeddings(base_url=f"{server}/v1", api_key="unused")
    assert embeddings.model == ADA and embeddings.check_embedding_ctx_length and embeddings.tiktoken_enabled
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        embeddings.embed_documents(documents(3))
    assert "token-id arrays are not supported" in str(refused.value)
    assert "check_embedding_ctx_length=False" in str(refused.value)


def test_llama_index_openai_embedding_and_openai_like(server, name):
    li = pytest.importorskip("llama_index.embeddings.openai")
    docs = documents(148) + chunks(2, 200, 400)  # embed_batch_size 100: two calls
    ref = reference(server, [*docs[:4], *docs[-2:]])
    default = li.OpenAIEmbedding(api_base=f"{server}/v1", api_key="unused")
    assert default.model_name == ADA
    np.testing.assert_allclose(default.get_text_embedding(docs[0]), ref[0], atol=1e-6)
    np.testing.assert_allclose(default.get_query_embedding(docs[1]), ref[1], atol=1e-6)
    batch = np.asarray(default.get_text_embedding_batch(docs))
    assert batch.shape[0] == 150
    np.testing.assert_allclose(batch[[0, 1, 2, 3, -2, -1]], ref, atol=1e-6)
    like = pytest.importorskip("llama_index.embeddings.openai_like")
    other = like.OpenAILikeEmbedding(model_name="anything", api_base=f"{server}/v1", api_key="unused")
    np.testing.assert_allclose(other.get_text_embedding(docs[-1]), ref[-1], atol=1e-6)
