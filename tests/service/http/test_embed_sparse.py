"""TEI's POST /embed_sparse on both front ends: the sparse vectors `disan.Encoder.encode_sparse`
gives, TEI's limits and errors, a 424 from a bundle without a lexical table, GET /info `sparse`;
and `hybrid` on /similarity and the rerank routes (or the server's `rerank_hybrid`), which mixes
the cosine with the same vectors' dot products."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from support_serving import wait_failed, wait_ready

from disan import Encoder
from service.main import create_app
from service.settings import Settings

TEXTS = ["a man is playing the guitar", "the dog runs in the park", "the the the"]
LONG = " ".join(["the man is playing the guitar in the park"] * 30)  # 270 tokens, over 128


def serving(bundle, fast_path, **settings):
    return TestClient(create_app(Settings(bundle=bundle, fast_path=fast_path, max_texts_per_request=4,
                                          **settings)))


@pytest.fixture(scope="module")
def client(sparse_bundle, fast_path):
    with serving(sparse_bundle, fast_path) as c:
        wait_ready(c.get)
        yield c


def as_pairs(vector: list[dict]) -> tuple[list[int], list[float]]:
    assert all(set(v) == {"index", "value"} for v in vector)
    return [v["index"] for v in vector], [v["value"] for v in vector]


def test_sparse_vectors_are_the_encoders(client, sparse_bundle):
    r = client.post("/embed_sparse", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    want = Encoder(sparse_bundle, variant="fp32").encode_sparse(TEXTS)
    for got, (idx, val) in zip(r.json(), want, strict=True):
        indices, values = as_pairs(got)
        assert indices == idx.tolist()
        np.testing.assert_allclose(values, val, rtol=1e-6)
    one = client.post("/embed_sparse", json={"inputs": TEXTS[0]}).json()
    assert len(one) == 1 and one[0] == r.json()[0]  # a single string gets a list of one, as TEI answers


def test_long_texts_are_weighed_whole_unless_truncated(client, sparse_bundle):
    encoder = Encoder(sparse_bundle, variant="fp32")
    whole = as_pairs(client.post("/embed_sparse", json={"inputs": [LONG]}).json()[0])
    assert whole[0] == encoder.encode_sparse([LONG])[0][0].tolist()
    cut = as_pairs(client.post("/embed_sparse", json={"inputs": [LONG], "truncate": True}).json()[0])
    first = " ".join(LONG.split()[:128])
    np.testing.assert_allclose(cut[1], encoder.encode_sparse([first])[0][1], rtol=1e-6)


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"inputs": []}, 422, "inputs"),
    ({"inputs": ""}, 422, "inputs"),
    ({"inputs": [[1, 2, 3]]}, 422, "token-id arrays are not supported"),
    ({"inputs": ["a"] * 5}, 413, "at most 4"),
    ({"inputs": "a man", "prompt_name": "query"}, 422, "no prompts"),
    ({"texts": ["a man"]}, 422, "inputs"),
])
def test_bad_requests_get_tei_errors(client, body, status, needle):
    r = client.post("/embed_sparse", json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "error_type"} and needle in r.json()["error"]


def test_info_says_whether_sparse_vectors_are_served(client, tiny_bundle, fast_path):
    assert client.get("/info").json()["sparse"]["served"] is True
    with serving(tiny_bundle, fast_path) as plain:
        wait_ready(plain.get)
        assert plain.get("/info").json()["sparse"]["served"] is False
        r = plain.post("/embed_sparse", json={"inputs": "a man"})
        assert r.status_code == 424, r.text
        assert r.json()["error_type"] == "Backend" and "model_export.lexical" in r.json()["error"]


def sparse_of(client, texts: list[str]) -> list[dict[int, float]]:
    return [{v["index"]: v["value"] for v in vector}
            for vector in client.post("/embed_sparse", json={"inputs": texts}).json()]


def dot(x: dict[int, float], y: dict[int, float]) -> float:
    return sum(value * y.get(index, 0.0) for index, value in x.items())


def test_similarity_hybrid_mixes_cosine_and_sparse_dot_in_every_form(client):
    query, texts = "the man plays the guitar", TEXTS[:2]
    body = {"query": query, "texts": texts}
    dense = client.post("/similarity", json=body).json()["ranking"]
    hybrid = client.post("/similarity", json={**body, "hybrid": 0.4}).json()["ranking"]
    q, docs = sparse_of(client, [query])[0], sparse_of(client, texts)
    cosine = {r["index"]: r["score"] for r in dense}
    want = {i: 0.6 * cosine[i] + 0.4 * dot(q, docs[i]) for i in range(len(texts))}
    assert [r["index"] for r in hybrid] == sorted(want, key=lambda i: -want[i])
    for r in hybrid:
        assert r["score"] == pytest.approx(want[r["index"]], abs=1e-5)
    pairs = [{"a": query, "b": t} for t in texts]
    scores = client.post("/similarity", json={"pairs": pairs, "hybrid": 1}).json()["scores"]
    np.testing.assert_allclose(scores, [dot(q, d) for d in docs], atol=1e-5)
    matrix = client.post("/similarity", json={"texts": texts, "hybrid": 1.0}).json()["matrix"]
    np.testing.assert_allclose(matrix, [[dot(x, y) for y in docs] for x in docs], atol=1e-5)
    assert client.post("/similarity", json={"texts": texts, "hybrid": 0}).json()["matrix"] == \
        client.post("/similarity", json={"texts": texts}).json()["matrix"]


def test_similarity_hybrid_errors(client, tiny_bundle, fast_path):
    r = client.post("/similarity", json={"texts": TEXTS, "hybrid": 1.5})
    assert r.status_code == 422 and "hybrid" in r.text
    with serving(tiny_bundle, fast_path) as plain:
        wait_ready(plain.get)
        r = plain.post("/similarity", json={"texts": TEXTS, "hybrid": 0.5})
        assert r.status_code == 424 and r.json()["error"]["type"] == "no_lexical_table", r.text
        assert plain.post("/similarity", json={"texts": TEXTS}).status_code == 200  # no hybrid: as before


def hybrid_want(client, query: str, texts: list[str], weight: float) -> dict[int, float]:
    """(1 - w) x /similarity's cosine + w x the dot product of /embed_sparse's vectors, per text."""
    cosine = {r["index"]: r["score"]
              for r in client.post("/similarity", json={"query": query, "texts": texts}).json()["ranking"]}
    q, docs = sparse_of(client, [query])[0], sparse_of(client, texts)
    return {i: (1 - weight) * cosine[i] + weight * dot(q, docs[i]) for i in range(len(texts))}


def test_rerank_hybrid_mixes_cosine_and_sparse_dot(client):
    query, texts = "the man plays the guitar", TEXTS
    want = hybrid_want(client, query, texts, 0.4)
    tei = client.post("/rerank", json={"query": query, "texts": texts, "hybrid": 0.4}).json()
    assert [r["index"] for r in tei] == sorted(want, key=lambda i: -want[i])
    for r in tei:
        assert r["score"] == pytest.approx(want[r["index"]], abs=1e-5)
    for route in ("/v1/rerank", "/v2/rerank"):
        cohere = client.post(route, json={"query": query, "documents": texts, "hybrid": 0.4}).json()
        assert [(r["index"], r["relevance_score"]) for r in cohere["results"]] == \
            [(r["index"], r["score"]) for r in tei]
    cosine = hybrid_want(client, query, texts, 0.0)
    plain = client.post("/rerank", json={"query": query, "texts": texts}).json()
    assert {r["index"]: r["score"] for r in plain} == pytest.approx(cosine, abs=1e-6)  # no hybrid: the cosine
    assert client.get("/info").json()["rerank"]["hybrid"] == 0.0


def test_rerank_hybrid_setting_serves_clients_that_cannot_send_it(sparse_bundle, fast_path):
    query, texts = "the man plays the guitar", TEXTS
    with serving(sparse_bundle, fast_path, rerank_hybrid=0.4) as c:
        wait_ready(c.get)
        assert c.get("/info").json()["rerank"]["hybrid"] == 0.4
        want = hybrid_want(c, query, texts, 0.4)
        got = c.post("/rerank", json={"query": query, "texts": texts}).json()
        assert {r["index"]: r["score"] for r in got} == pytest.approx(want, abs=1e-5)
        cohere = c.post("/v1/rerank", json={"query": query, "documents": texts}).json()["results"]
        assert {r["index"]: r["relevance_score"] for r in cohere} == pytest.approx(want, abs=1e-5)
        # a request's own weight wins, 0 included
        cosine = hybrid_want(c, query, texts, 0.0)
        got = c.post("/rerank", json={"query": query, "texts": texts, "hybrid": 0}).json()
        assert {r["index"]: r["score"] for r in got} == pytest.approx(cosine, abs=1e-6)


def test_rerank_hybrid_errors(client, tiny_bundle, fast_path):
    r = client.post("/rerank", json={"query": "a man", "texts": TEXTS, "hybrid": -0.1})
    assert r.status_code == 422 and "hybrid" in r.text
    with serving(tiny_bundle, fast_path) as plain:
        wait_ready(plain.get)
        r = plain.post("/rerank", json={"query": "a man", "texts": TEXTS, "hybrid": 0.5})
        assert r.status_code == 424 and r.json()["error_type"] == "Backend", r.text
        r = plain.post("/v1/rerank", json={"query": "a man", "documents": TEXTS, "hybrid": 0.5})
        assert r.status_code == 424 and r.json()["error"]["type"] == "no_lexical_table", r.text
        assert plain.post("/rerank", json={"query": "a man", "texts": TEXTS}).status_code == 200


def test_rerank_hybrid_setting_without_a_lexical_table_fails_the_load(tiny_bundle, fast_path):
    with serving(tiny_bundle, fast_path, rerank_hybrid=0.3) as c:
        wait_failed(c.get)
