"""End-to-end API tests on the tiny exported bundle: every endpoint, OpenAI shape, provider, metrics."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support_serving import wait_ready

from disan.bundle.manifest import load_manifest, sha256_file
from service.main import create_app
from service.settings import Settings

WORDS = ["a", "man", "is", "playing", "guitar", "the", "movie", "was", "great", "bad", "not", "zebra"]


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    app = create_app(Settings(bundle=tiny_bundle, max_wait_ms=1.0, fast_path=fast_path))
    with TestClient(app) as c:
        wait_ready(c.get)
        yield c


def embed(client: TestClient, texts: list[str], **kw) -> np.ndarray:
    r = client.post("/embed", json={"texts": texts, **kw})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float64)


def test_health_and_ready(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["status"] == "ready"


def test_embed_shape_usage_and_normalize(client):
    r = client.post("/embed", json={"texts": ["a man is playing", "the movie was great !"]})
    body = r.json()
    assert r.status_code == 200
    assert body["dim"] == len(body["embeddings"][0]) and len(body["embeddings"]) == 2
    assert body["usage"]["tokens"] == 4 + 5
    assert isinstance(body["model"], str) and body["model"]
    raw = np.asarray(body["embeddings"])
    unit = embed(client, ["a man is playing", "the movie was great !"], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)
    assert not np.allclose(raw[0], raw[1])  # different sentences, different vectors


def test_nli(client):
    r = client.post("/nli", json={"pairs": [{"premise": "a man is playing guitar",
                                             "hypothesis": "a man is playing"},
                                            {"premise": "the movie", "hypothesis": "not great"}]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2
    for res in results:
        assert set(res["scores"]) == {"entailment", "neutral", "contradiction"}
        assert abs(sum(res["scores"].values()) - 1) < 1e-4
        assert res["label"] == max(res["scores"], key=res["scores"].get)


def test_sentiment_with_polarity(client):
    r = client.post("/sentiment", json={"texts": ["the movie was great", "bad"]})
    assert r.status_code == 200, r.text
    for res in r.json()["results"]:
        assert len(res["scores"]) == 5 and abs(sum(res["scores"].values()) - 1) < 1e-4
        assert res["label"] == max(res["scores"], key=res["scores"].get)
        assert res["polarity"] in {"negative", "neutral", "positive"}
        assert "explanation" not in res


def test_sentiment_explain_matches_plain_graph(client):
    texts = ["the movie was not great", "bad"]
    plain = client.post("/sentiment", json={"texts": texts}).json()["results"]
    explained = client.post("/sentiment", json={"texts": texts, "explain": True}).json()["results"]
    for p, e in zip(plain, explained, strict=True):
        assert e["label"] == p["label"]
        for k in p["scores"]:
            assert abs(e["scores"][k] - p["scores"][k]) < 1e-5
    ex = explained[0]["explanation"]
    n = len(ex["tokens"])
    assert ex["tokens"] == ["the", "movie", "was", "not", "great"]
    assert len(ex["token_weights"]) == len(ex["gate_fw"]) == len(ex["gate_bw"]) == n
    assert abs(sum(ex["token_weights"]) - 1) < 1e-4
    assert len(ex["attention_fw"]) == n and all(len(row) == n for row in ex["attention_bw"])


def test_embed_explain(client):
    texts = ["a man is playing guitar", "bad"]
    plain = embed(client, texts)
    r = client.post("/embed", json={"texts": texts, "explain": True})
    assert r.status_code == 200, r.text
    body = r.json()
    np.testing.assert_allclose(np.asarray(body["embeddings"]), plain, atol=1e-5)  # the same vectors
    first, second = body["explanations"]
    assert first["tokens"] == ["a", "man", "is", "playing", "guitar"] and second["tokens"] == ["bad"]
    assert len(first["token_weights"]) == 5 and second["token_weights"] == [pytest.approx(1.0)]
    assert abs(sum(first["token_weights"]) - 1) < 1e-4 and min(first["token_weights"]) > 0
    assert "explanations" not in client.post("/embed", json={"texts": texts}).json()


def test_nli_explain(client):
    pairs = [{"premise": "a man is playing guitar", "hypothesis": "a man plays music"},
             {"premise": "dog", "hypothesis": "the cat is not sleeping"}]
    plain = client.post("/nli", json={"pairs": pairs}).json()["results"]
    r = client.post("/nli", json={"pairs": pairs, "explain": True})
    assert r.status_code == 200, r.text
    explained = r.json()["results"]
    for p, e in zip(plain, explained, strict=True):
        assert e["label"] == p["label"]
        assert all(abs(e["scores"][k] - p["scores"][k]) < 1e-5 for k in p["scores"])
        assert "explanation" not in p
    ex = explained[0]["explanation"]
    assert ex["premise"]["tokens"] == ["a", "man", "is", "playing", "guitar"]
    assert ex["hypothesis"]["tokens"] == ["a", "man", "plays", "music"]
    for side in ("premise", "hypothesis"):
        n = len(ex[side]["tokens"])
        assert len(ex[side]["token_weights"]) == len(ex[side]["attribution"]) == n
        assert abs(sum(ex[side]["token_weights"]) - 1) < 1e-4
        assert all(-1 <= a <= 1 for a in ex[side]["attribution"])
    # A one-token premise left out is an empty sentence (a zero vector): its attribution is
    # the predicted label's probability minus the head's on (0, hypothesis vector).
    runtime = client.app.state.engine.runtime
    one = explained[1]
    v = runtime.embed([runtime.text_ids("the cat is not sleeping")])[0]
    without = runtime.nli_head([(np.zeros_like(v), v)])[0]
    label = runtime.labels["nli"].index(one["label"])
    want = one["scores"][one["label"]] - float(without[label])
    assert one["explanation"]["premise"]["attribution"] == [pytest.approx(want, abs=1e-5)]


def test_explain_is_bounded_before_any_work(tiny_bundle, fast_path):
    """explain=true costs an unchunked pass (and on /nli a head row per token): at most
    max_explain_texts texts or pairs per request, refused before tokenizing."""
    app = create_app(Settings(bundle=tiny_bundle, max_explain_texts=2, fast_path=fast_path))
    with TestClient(app) as c:
        wait_ready(c.get)
        pair = {"premise": "a", "hypothesis": "b"}
        for path, body in (("/embed", {"texts": ["a"] * 3}), ("/sentiment", {"texts": ["a"] * 3}),
                           ("/nli", {"pairs": [pair] * 3})):
            r = c.post(path, json={**body, "explain": True})
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text
            assert "explain" in r.json()["error"]["message"]
            assert c.post(path, json=body).status_code == 200  # the same request unexplained is fine
        assert c.post("/nli", json={"pairs": [pair] * 2, "explain": True}).status_code == 200


def test_nli_fits_a_queue_sized_for_one_request(tiny_bundle):
    """/nli queues two sentences per pair on the encoder: a full request must still fit when
    the queue only holds max_texts_per_request items (the settings allow that)."""
    app = create_app(Settings(bundle=tiny_bundle, max_texts_per_request=4, queue_limit=4))
    with TestClient(app) as c:
        wait_ready(c.get)
        pairs = [{"premise": "a man", "hypothesis": "a dog"}] * 4
        for explain in (False, True):
            r = c.post("/nli", json={"pairs": pairs, "explain": explain})
            assert r.status_code == 200, r.text


def test_embed_base64_decodes_to_the_float_vectors(client):
    texts = ["a man is playing", "the movie was great"]
    floats = embed(client, texts, normalize=True)
    r = client.post("/embed", json={"texts": texts, "normalize": True, "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert all(isinstance(e, str) for e in body["embeddings"]) and body["usage"]["tokens"] == 8
    decoded = np.stack([np.frombuffer(base64.b64decode(e), dtype="<f4") for e in body["embeddings"]])
    assert decoded.shape == (2, body["dim"])
    np.testing.assert_array_equal(decoded, floats.astype(np.float32))  # float32 round-trips exactly
    bad = client.post("/embed", json={"texts": texts, "encoding_format": "hex"})
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"


def test_openai_embeddings_float_and_base64(client):
    texts = ["a man is playing", "the movie was great"]
    name = client.get("/v1/models").json()["data"][0]["id"]  # `model` is checked (test_openai_compat.py)
    f = client.post("/v1/embeddings", json={"input": texts, "model": name}).json()
    assert f["object"] == "list" and isinstance(f["model"], str)
    assert [d["index"] for d in f["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in f["data"])
    assert f["usage"]["prompt_tokens"] == f["usage"]["total_tokens"] == 8
    vecs = np.asarray([d["embedding"] for d in f["data"]])
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)  # OpenAI-style unit vectors
    np.testing.assert_allclose(vecs, embed(client, texts, normalize=True), atol=1e-6)
    b = client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b["data"]])
    np.testing.assert_allclose(decoded, vecs, atol=1e-6)
    single = client.post("/v1/embeddings", json={"input": "a man is playing"}).json()
    assert len(single["data"]) == 1
    np.testing.assert_allclose(single["data"][0]["embedding"], vecs[0], atol=1e-6)


def test_openai_dimensions_must_match(client):
    dim = client.get("/info").json()["dim"]
    assert client.post("/v1/embeddings", json={"input": "a", "dimensions": dim}).status_code == 200
    r = client.post("/v1/embeddings", json={"input": "a", "dimensions": dim + 1})
    assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request"


def test_info_names_the_checkpoints_being_served(client, tiny_checkpoints):
    # An operator tells two deployments of one bundle name apart by what they serve.
    sources = client.get("/info").json()["bundle"]["sources"]
    assert sources == {task: {"file": f"{task}.pt", "sha256": sha256_file(getattr(tiny_checkpoints, task))}
                       for task in ("nli", "sentiment")}


def test_info_gives_the_fingerprint_of_each_route_in_use(client, tiny_bundle):
    # A client that stores vectors keeps the embed fingerprint: the same one means the same vectors.
    info = client.get("/info").json()
    got = info["bundle"]["route_fingerprints"]
    recorded = load_manifest(tiny_bundle)["route_fingerprints"]
    in_use = f"{info['bundle']['graph_set']}/{info['variant']}"
    assert got == {route: fps[in_use] for route, fps in recorded.items()}
    assert len(got["embed"]) == 64 and got["embed"] != got["sentiment"]


def test_info_reports_the_live_session_provider(client):
    info = client.get("/info").json()
    runtime = client.app.state.engine.runtime
    live = {name: g.session.get_providers()[0] for name, g in runtime.graphs.items()}
    assert info["providers"] == live
    assert info["provider"] == live["encoder"]
    assert info["dim"] == runtime.dim and info["limits"]["max_tokens"] == runtime.max_tokens
    assert set(info["labels"]) == {"nli", "sentiment"}
    assert info["model"] == "tiny-disan"  # the manifest's name, as given to `disan export --name`
    assert info["bundle"]["borrowed_words"] == {}  # no model borrows the encoder's words here
    assert info["bundle"]["ensemble_members"] == {}  # a single sentiment model


def test_default_call_layout_on_cpu(client):
    """Defaults on CPU: one single-threaded ORT call per core in flight, reported by /info."""
    from disan.runtime.ort_session import cpu_cores

    runtime = client.app.state.engine.runtime
    assert client.get("/info").json()["batching"]["batch_concurrency"] == cpu_cores()
    assert client.app.state.engine.batchers["encoder"].concurrency == cpu_cores()
    for graph in runtime.graphs.values():
        assert graph.session.get_session_options().intra_op_num_threads == 1


def test_metrics_exposed(client):
    client.post("/embed", json={"texts": ["a man"]})
    client.post("/embed", json={"texts": []})
    text = client.get("/metrics").text
    assert 'disan_requests_total{method="POST",route="/embed",status="200"}' in text
    assert 'disan_requests_total{method="POST",route="/embed",status="422"}' in text
    for family in ("disan_request_duration_seconds_bucket", 'disan_queue_depth{graph="encoder"}',
                   'disan_batch_size_bucket{graph="encoder"', 'disan_batch_padded_cells_bucket',
                   'disan_inference_seconds_bucket{graph="nli_head"'):
        assert family in text, family


def test_unicode_and_control_characters(client):
    texts = ["Zürich ☃ 你好 🙂", "a\x00man\x1f\u200bis\tplaying", "\u0301\u0301 man"]
    r = client.post("/embed", json={"texts": texts})
    assert r.status_code == 200, r.text
    assert np.isfinite(np.asarray(r.json()["embeddings"])).all()


texts_strategy = st.lists(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=20).map(" ".join), min_size=2, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=texts_strategy)
def test_batching_never_changes_results(client, texts):
    together = embed(client, texts)
    alone = np.concatenate([embed(client, [t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("path", "body", "model"), [
    ("/embed", {"texts": ["a man is playing", "zebra"], "normalize": True}, "EmbedResponse"),
    ("/nli", {"pairs": [{"premise": "a man is playing", "hypothesis": "a man"}]}, "NLIResponse"),
    ("/sentiment", {"texts": ["the movie was great"]}, "SentimentResponse"),
    ("/sentiment", {"texts": ["the movie was bad"], "explain": True}, "SentimentResponse"),
    ("/embed", {"texts": ["a man is playing"], "explain": True}, "EmbedResponse"),
    ("/nli", {"pairs": [{"premise": "a man", "hypothesis": "a dog"}], "explain": True}, "NLIResponse"),
    ("/v1/embeddings", {"input": ["a man", "the movie"]}, "OpenAIEmbeddingsResponse"),
    ("/tokenize", {"texts": ["a man isn't", "zebra"]}, "TokenizeResponse"),
    ("/similarity", {"pairs": [{"a": "a man", "b": "the movie"}]}, "SimilarityResponse"),
    ("/similarity", {"query": "a man", "texts": ["a", "the movie"]}, "SimilarityResponse"),
    ("/similarity", {"texts": ["a man", "the movie"]}, "SimilarityResponse"),
])
def test_responses_match_their_declared_models(client, path, body, model):
    """The routes serialise with orjson, bypassing FastAPI's response validation: every
    response must still be exactly what its declared (OpenAPI) model allows."""
    from service.http import openai_schemas, schemas

    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    cls = getattr(schemas, model, None) or getattr(openai_schemas, model)
    parsed = cls.model_validate_json(r.content, strict=False)
    assert parsed.model_dump(mode="json", exclude_none=True) == r.json()
    assert client.get("/openapi.json").json()["paths"][path]["post"]["responses"]["200"]
