"""text-embeddings-inference's API beside ours (POST /, TEI bodies on /embed, /similarity and
/tokenize, /rerank, /predict, TEI's /info fields) and Cohere/Jina's /v1/rerank, on both front
ends: answers in each family's shape, vectors equal to /embed's, errors in the request's family's
shape, the rerank routes through admission control. Real clients: tests/service/test_clients_tei.py."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from support_serving import block_runner, until_loaded, wait_ready

from service.main import create_app
from service.settings import Settings

TEXTS = ["a man is playing the guitar", "the dog runs in the park", "a woman plays music", "a man"]
LONG = " ".join(["the man is playing the guitar in the park"] * 30)  # 270 tokens, over 128
SCOPE = {"type": "http", "method": "POST", "raw_path": b"", "query_string": b"", "http_version": "1.1",
         "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": "",
         "asgi": {"version": "3.0"}}


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, max_texts_per_request=8))
    with TestClient(app) as c:
        wait_ready(c.get)
        yield c


def ours(client, texts: list[str], normalize: bool = True, **extra) -> np.ndarray:
    r = client.post("/embed", json={"texts": texts, "normalize": normalize, **extra})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float64)


def assert_cosines_equal(a, b) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.9999, cos


def tei_error(r, status: int, error_type: str = "Validation") -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    return body["error"]


@pytest.mark.parametrize("path", ["/", "/embed"])
def test_tei_embed_answers_a_bare_list_of_the_same_vectors(client, path):
    one = client.post(path, json={"inputs": TEXTS[0]})
    assert one.status_code == 200, one.text
    assert len(one.json()) == 1  # a single string too gets a list of one vector, as TEI answers
    assert_cosines_equal(one.json(), ours(client, TEXTS[:1]))
    np.testing.assert_allclose(np.linalg.norm(one.json(), axis=1), 1.0, atol=1e-5)  # TEI's default
    many = client.post(path, json={"inputs": TEXTS, "truncate": True})
    assert_cosines_equal(many.json(), ours(client, TEXTS))
    raw = client.post(path, json={"inputs": TEXTS, "normalize": False}).json()
    np.testing.assert_allclose(raw, ours(client, TEXTS, normalize=False), rtol=1e-5, atol=1e-6)
    sized = client.post(path, json={"inputs": TEXTS[:2], "dimensions": 16}).json()
    assert_cosines_equal(sized, ours(client, TEXTS[:2]))


def test_our_body_keeps_its_richer_answer(client):
    r = client.post("/embed", json={"texts": TEXTS[:1]})
    assert set(r.json()) >= {"model", "dim", "embeddings", "usage"}


def test_tei_long_texts_window_by_default_and_truncate_from_either_end(client):
    default = client.post("/embed", json={"inputs": [LONG]}).json()
    assert_cosines_equal(default, ours(client, [LONG]))  # windowed, as our default
    right = client.post("/embed", json={"inputs": [LONG], "truncate": True}).json()
    assert_cosines_equal(right, ours(client, [LONG], long_text="truncate"))
    words = LONG.split()
    left = client.post("/embed", json={"inputs": [LONG], "truncate": True,
                                       "truncation_direction": "left"}).json()
    # the last 128 tokens (one word = one token here)
    assert_cosines_equal(left, ours(client, [" ".join(words[-128:])]))
    upper = client.post("/embed", json={"inputs": [LONG], "truncate": True,
                                        "truncation_direction": "Left"}).json()
    np.testing.assert_allclose(upper, left)
    assert not np.allclose(left, right)


def test_tei_similarity_on_its_route_and_on_the_root(client):
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}, "parameters": {}}
    vectors = ours(client, TEXTS)
    expected = vectors[1:] @ vectors[0]
    for path in ("/similarity", "/"):
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json(), expected, atol=1e-5)
    assert "ranking" in client.post("/similarity", json={"query": TEXTS[0], "texts": TEXTS[1:]}).json()


def test_tei_tokenize_gives_tei_tokens_with_offsets(client, tiny_vocab):
    r = client.post("/tokenize", json={"inputs": "A man isn't playing", "add_special_tokens": True})
    assert r.status_code == 200, r.text
    tokens = r.json()[0]
    assert [t["text"] for t in tokens] == ["a", "man", "is", "n't", "playing"]
    assert [t["id"] for t in tokens] == tiny_vocab.ids(["a", "man", "is", "n't", "playing"])
    assert [(t["start"], t["stop"]) for t in tokens] == [(0, 1), (2, 5), (6, 8), (8, 11), (12, 19)]
    assert not any(t["special"] for t in tokens)
    assert len(client.post("/tokenize", json={"inputs": TEXTS}).json()) == len(TEXTS)
    assert "results" in client.post("/tokenize", json={"texts": TEXTS}).json()


def test_tei_rerank_is_the_cosine_ranking_best_first(client):
    vectors = ours(client, [TEXTS[0], *TEXTS[1:]])
    cosines = vectors[1:] @ vectors[0]
    r = client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS[1:], "return_text": True,
                                     "raw_scores": True, "truncate": True})
    assert r.status_code == 200, r.text
    ranks = r.json()
    assert [x["index"] for x in ranks] == list(np.argsort(-cosines, kind="stable"))
    np.testing.assert_allclose([x["score"] for x in ranks], np.sort(cosines)[::-1], atol=1e-5)
    assert [x["text"] for x in ranks] == [TEXTS[1:][x["index"]] for x in ranks]
    plain = client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS[1:]}).json()
    assert all(set(x) == {"index", "score"} for x in plain)
    info = client.get("/info").json()
    assert "cosine" in info["rerank"]["method"] and "bi-encoder" in info["rerank"]["method"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_jina_rerank(client, path):
    vectors = ours(client, TEXTS)
    cosines = vectors[1:] @ vectors[0]
    documents = [TEXTS[1], {"text": TEXTS[2]}, TEXTS[3]]
    r = client.post(path, json={"query": TEXTS[0], "documents": documents, "top_n": 2,
                                "model": "rerank-english-v3.0", "rank_fields": ["text"]})
    assert r.status_code == 200, r.text
    body = r.json()
    order = list(np.argsort(-cosines, kind="stable"))
    assert [x["index"] for x in body["results"]] == order[:2]
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], np.sort(cosines)[::-1][:2],
                               atol=1e-5)
    assert [x["document"]["text"] for x in body["results"]] == [TEXTS[1:][i] for i in order[:2]]
    assert body["usage"]["total_tokens"] == sum(len(t.split()) for t in TEXTS) and body["id"]
    bare = client.post(path, json={"query": TEXTS[0], "documents": TEXTS[1:],
                                   "return_documents": False}).json()
    assert len(bare["results"]) == 3 and all("document" not in x for x in bare["results"])


def test_predict_single_texts_to_sentiment_and_pairs_to_nli(client):
    sentiment = client.post("/sentiment", json={"texts": [TEXTS[0]]}).json()["results"][0]["scores"]
    nli = client.post("/nli", json={"pairs": [{"premise": TEXTS[0], "hypothesis": TEXTS[2]}]}).json()
    nli = nli["results"][0]["scores"]
    one = client.post("/predict", json={"inputs": TEXTS[0]})
    assert one.status_code == 200, one.text
    assert [p["label"] for p in one.json()] == sorted(sentiment, key=lambda k: -sentiment[k])
    assert {p["label"]: p["score"] for p in one.json()} == pytest.approx(sentiment, abs=1e-6)
    pair = client.post("/predict", json={"inputs": [TEXTS[0], TEXTS[2]]}).json()
    assert {p["label"]: p["score"] for p in pair} == pytest.approx(nli, abs=1e-6)
    batch = client.post("/predict", json={"inputs": [[TEXTS[0]], [TEXTS[0], TEXTS[2]]],
                                          "raw_scores": True}).json()
    assert len(batch) == 2
    assert {p["label"]: np.exp(p["score"]) for p in batch[0]} == pytest.approx(sentiment, abs=1e-6)
    assert {p["label"]: np.exp(p["score"]) for p in batch[1]} == pytest.approx(nli, abs=1e-6)


def test_info_has_tei_fields_beside_ours(client):
    info = client.get("/info").json()
    assert info["model_id"] == info["model"] == info["served_model_name"]
    assert info["max_input_length"] == info["limits"]["max_tokens"] == 128
    assert info["max_client_batch_size"] == info["limits"]["max_texts_per_request"] == 8
    assert info["max_concurrent_requests"] == info["limits"]["max_concurrent_requests"]
    assert info["model_type"] == {"embedding": {"pooling": "source2token"}}
    assert info["model_dtype"] in ("float32", "float16", "int8") and info["version"]


@pytest.mark.parametrize(("path", "body", "status", "names"), [
    ("/embed", {"inputs": []}, 422, "inputs"),
    ("/embed", {"inputs": [[1, 2, 3]]}, 422, "token-id"),
    ("/embed", {"inputs": ["a", ""]}, 422, "inputs[1]"),
    ("/embed", {"inputs": "a man", "dimensions": 5}, 422, "dimensions"),
    ("/embed", {"inputs": "a man", "prompt_name": "query"}, 422, "prompt_name"),
    ("/embed", {"inputs": ["a man"] * 9}, 413, "at most 8"),
    ("/", {"inputs": {"source_sentence": "a man"}}, 422, "inputs.sentences"),
    ("/", {"texts": ["a man"]}, 422, "inputs"),
    ("/similarity", {"inputs": {"source_sentence": "a man", "sentences": ["x"] * 9}}, 413,
     "inputs.sentences"),
    ("/tokenize", {"inputs": ""}, 422, "inputs"),
    ("/rerank", {"query": "a man", "texts": []}, 422, "texts"),
    ("/rerank", {"query": "", "texts": ["a man"]}, 422, "query"),
    ("/rerank", {"query": "a man", "texts": ["a man"] * 9}, 413, "texts"),
    ("/rerank", {"query": "a man", "texts": ["a man"], "truncation_direction": "up"}, 422,
     "truncation_direction"),
    ("/predict", {"inputs": ["a", "b", "c"]}, 422, "pair"),
    ("/predict", {"inputs": [["a", "b", "c"]]}, 422, "inputs[0]"),
    ("/predict", {"inputs": [["a"]] * 9}, 413, "at most 8"),
    ("/predict", {"inputs": [["a" * 100_001]]}, 413, "inputs[0][0]"),
])
def test_tei_errors_have_tei_body_naming_the_problem(client, path, body, status, names):
    assert names in tei_error(client.post(path, json=body), status)


@pytest.mark.parametrize(("path", "body", "status", "names"), [
    ("/v1/rerank", {"query": "a man", "documents": []}, 422, "documents"),
    ("/v1/rerank", {"query": "a man", "documents": [{"title": "x"}]}, 422, "documents[0]"),
    ("/v1/rerank", {"query": "a man", "documents": ["a"], "top_n": 0}, 422, "top_n"),
    ("/v1/rerank", {"query": "a man", "documents": ["a"] * 9}, 413, "documents"),
    ("/embed", {"texts": []}, 422, "texts"),
])
def test_our_family_keeps_our_error_body(client, path, body, status, names):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert names in r.json()["error"]["message"]


def test_tei_routes_answer_tei_errors_before_the_body_too(client):
    tei_error(client.get("/rerank"), 405)
    tei_error(client.post("/predict", content=b"{not json", headers={"content-type": "application/json"}),
              400)
    ours_ = client.post("/embed", content=b"{not json", headers={"content-type": "application/json"})
    assert ours_.json()["error"]["type"] == "malformed_json"  # unread family: ours


def test_openapi_shows_both_bodies(client):
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in body["oneOf"]} == {"EmbedRequest", "TEIEmbedRequest"}
    for path in ("/", "/rerank", "/predict", "/v1/rerank", "/v2/rerank"):
        assert "post" in schema["paths"][path]
    assert "TEIErrorResponse" in json.dumps(schema["paths"]["/rerank"]["post"]["responses"]["422"])


@pytest.mark.parametrize(("path", "payload"), [
    ("/rerank", {"query": "a man", "texts": ["a dog runs"]}),
    ("/v1/rerank", {"query": "a man", "documents": ["a dog runs"]}),
])
def test_rerank_goes_through_admission_and_the_batcher(tiny_bundle, fast_path, path, payload):
    """With the one slot taken by a rerank whose batch is held in the batcher, a second rerank is
    refused 429 before its body is read (in TEI's body on /rerank); the first then answers."""
    async def main():
        app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, max_concurrent_requests=1,
                                  admission_wait_s=0.1, batch_concurrency=1))
        engine = app.state.engine
        await engine.start()
        await until_loaded(engine)
        gate, entered = block_runner(engine.batchers["encoder"])

        async def call(reads: list[int]):
            sent: list[dict] = []
            body = json.dumps(payload).encode()

            async def receive():
                reads.append(1)
                if len(reads) == 1:
                    return {"type": "http.request", "body": body, "more_body": False}
                await asyncio.Event().wait()

            async def send(message):
                sent.append(message)

            await app({**SCOPE, "path": path, "headers": [(b"content-type", b"application/json")]},
                      receive, send)
            start = next(m for m in sent if m["type"] == "http.response.start")
            return start["status"], json.loads(b"".join(m.get("body", b"") for m in sent))

        first = asyncio.ensure_future(call([]))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        reads: list[int] = []
        refused = await call(reads)
        gate.set()
        admitted = await first
        await engine.stop()
        return admitted, refused, reads

    admitted, (status, body), reads = asyncio.run(main())
    assert admitted[0] == 200 and status == 429 and reads == []
    assert body["error_type"] == "Overloaded" if path == "/rerank" else body["error"]["type"] == "overloaded"
