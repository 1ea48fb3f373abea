"""OpenAI compatibility that real clients need: 2,048 inputs, texts of any length, token-id arrays,
any `model` name (strict mode and aliases as settings), /v1/models, one message per kind of bad
input (both front ends)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from support_serving import wait_ready

from disan.text.windowing import EMBEDDING_LEAD
from service.main import create_app
from service.settings import Settings

ALIAS = "text-embedding-3-small"
LONG = " ".join(["the man is playing"] * 50)  # 200 tokens, over the tiny bundle's 128


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, model_aliases=[ALIAS]))
    with TestClient(app) as c:
        wait_ready(c.get)
        yield c


@pytest.fixture(scope="module")
def small(tiny_bundle, fast_path):
    """A server whose queue holds only 4 sentences, with /v1 truncation on."""
    settings = Settings(bundle=tiny_bundle, fast_path=fast_path, max_texts_per_request=4, queue_limit=4,
                        openai_max_inputs=10, openai_truncate=True)
    with TestClient(create_app(settings)) as c:
        wait_ready(c.get)
        yield c


@pytest.fixture(scope="module")
def strict(tiny_bundle, fast_path):
    """A server with the strict settings: unknown `model` -> 404, long inputs -> 422."""
    settings = Settings(bundle=tiny_bundle, fast_path=fast_path, model_aliases=[ALIAS],
                        openai_strict_model=True, openai_long_text="error")
    with TestClient(create_app(settings)) as c:
        wait_ready(c.get)
        yield c


def vectors(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.asarray([d["embedding"] for d in response.json()["data"]])


def test_v1_takes_2048_inputs_in_order_while_other_routes_keep_their_limit(client):
    texts = [f"the man is playing {'a guitar ' * (i % 5)}".strip() for i in range(2048)]
    r = client.post("/v1/embeddings", json={"input": texts})
    got = vectors(r)
    assert [d["index"] for d in r.json()["data"]] == list(range(2048))
    # the chunks come back in order: spot-check rows against /embed of the same texts
    ref = client.post("/embed", json={"texts": texts[:5], "normalize": True}).json()["embeddings"]
    np.testing.assert_allclose(got[:5], ref, atol=1e-6)
    tail = client.post("/v1/embeddings", json={"input": texts[2045:]})
    np.testing.assert_allclose(got[2045:], vectors(tail), atol=1e-6)
    too_many = client.post("/v1/embeddings", json={"input": texts + ["one more"]})
    assert too_many.status_code == 413
    assert too_many.json()["error"]["message"] == "input: 2049 items, at most 2048 per request"
    assert client.post("/embed", json={"texts": texts[:257]}).status_code == 413


def test_v1_splits_a_long_list_so_the_queue_bound_holds(small):
    """10 inputs on a server whose queue holds 4: run 4 at a time, never one 10-sentence submit."""
    texts = [f"a dog {'runs ' * i}".strip() for i in range(10)]
    got = vectors(small.post("/v1/embeddings", json={"input": texts}))
    assert got.shape[0] == 10
    ref = small.post("/embed", json={"texts": texts[8:], "normalize": True}).json()["embeddings"]
    np.testing.assert_allclose(got[8:], ref, atol=1e-6)
    assert small.post("/embed", json={"texts": texts[:5]}).status_code == 413


def test_v1_long_inputs_are_windowed_by_default_and_truncate_or_error_by_setting(client, small, strict):
    r = client.post("/v1/embeddings", json={"input": [LONG, "a man"]})
    got = vectors(r)
    assert r.json()["usage"] == {"prompt_tokens": 200 + 2, "total_tokens": 202, "truncated_inputs": 0,
                                 "windowed_inputs": 1, "empty_inputs": 0}
    windowed = client.post("/embed", json={"texts": [LONG], "normalize": True}).json()
    np.testing.assert_allclose(got[0], windowed["embeddings"][0], atol=1e-6)
    r = small.post("/v1/embeddings", json={"input": [LONG, "a man"]})
    got = vectors(r)
    assert r.json()["usage"]["truncated_inputs"] == 1 and r.json()["usage"]["prompt_tokens"] == 128 + 2
    cut = small.post("/embed", json={"texts": [LONG], "truncate": True, "normalize": True}).json()
    np.testing.assert_allclose(got[0], cut["embeddings"][0], atol=1e-6)
    refused = strict.post("/v1/embeddings", json={"input": ["a man", LONG, LONG]})
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    assert "input[1]: 200 tokens, at most 128" in message and "input[2]: 200 tokens" in message
    assert "openai_long_text" in message


def test_a_5000_token_document_is_one_window_pooled_vector(client):
    """The pooled vector is the token-weighted mean of the windows' own vectors, the first window
    counting twice (checked against /embed of each window's words), then normalised."""
    words = ("the man is playing a guitar in the park and the dog runs on the grass . " * 400).split()[:5000]
    r = client.post("/v1/embeddings", json={"input": " ".join(words)})
    got = vectors(r)[0]
    assert r.json()["usage"]["prompt_tokens"] == 5000 and r.json()["usage"]["windowed_inputs"] == 1
    starts = [*range(0, 5000 - 128, 128), 5000 - 128]
    windows = [" ".join(words[s:s + 128]) for s in starts]
    raw = np.asarray(client.post("/embed", json={"texts": windows[:20]}).json()["embeddings"] +
                     client.post("/embed", json={"texts": windows[20:]}).json()["embeddings"])
    # every window is full (the last one ends at the text's end); the first counts EMBEDDING_LEAD times
    expected = raw.sum(axis=0) + (EMBEDDING_LEAD - 1) * raw[0]
    np.testing.assert_allclose(got, expected / np.linalg.norm(expected), atol=1e-5)


@pytest.mark.parametrize(("value", "message"), [
    ([], "input: the list is empty; send at least one string"),
    ([""], "input[0]: the empty string"),
    ("", "input: the empty string; send at least one character"),
    (None, "input: got null, expected a string or a non-empty list of strings"),
    (5, "input: got number, expected a string or a non-empty list of strings"),
    (["a", 1], "input[1]: not a string (got number)"),
    (["a", "", 3, "b", "", {"x": 1}, "c", ""], "input[1], input[4], input[7]: the empty string"),
])
def test_each_bad_input_gets_its_own_message_naming_every_item(client, value, message):
    r = client.post("/v1/embeddings", json={"input": value})
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]["message"]
    if value == ["a", "", 3, "b", "", {"x": 1}, "c", ""]:
        assert "input[2], input[5]: not a string (got number, object)" in r.json()["error"]["message"]


def test_whitespace_and_control_only_inputs_are_embedded_not_422(client):
    r = client.post("/v1/embeddings", json={"input": ["a man", "\n\n", "\t", "\u200b", "a dog"]})
    got = vectors(r)
    assert got.shape[0] == 5 and r.json()["usage"]["empty_inputs"] == 3
    np.testing.assert_allclose(got[1], got[2])
    np.testing.assert_allclose(got[1], got[3])


def test_openapi_states_the_2048_input_limit(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]["OpenAIEmbeddingsRequest"]
    lists = [s for s in schema["properties"]["input"]["anyOf"] if s.get("type") == "array"]
    assert lists and lists[0]["maxItems"] == 2048 and lists[0]["minItems"] == 1


def test_langchains_1000_token_id_arrays_get_the_token_id_answer_not_413(client):
    """LangChain's default path sends 1,000 tiktoken arrays per call: 70k+ JSON items, over the
    items limit; the answer must still say what to set."""
    body = json.dumps({"input": [list(range(1000 + i, 1070 + i)) for i in range(1000)],
                       "model": "text-embedding-ada-002", "encoding_format": "base64"})
    r = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "check_embedding_ctx_length=False" in r.json()["error"]["message"]


@pytest.mark.parametrize("token_ids", [[1, 2, 3], [[1, 2, 3], [4, 5]]], ids=["one", "list"])
def test_token_id_arrays_get_a_422_that_says_what_to_set(client, token_ids):
    r = client.post("/v1/embeddings", json={"input": token_ids})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert message.startswith("input: token-id arrays are not supported")
    assert "check_embedding_ctx_length=False" in message and "/tokenize" in message


def test_v1_models_lists_the_served_name_and_aliases(client):
    name = client.get("/info").json()["model"]
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == [name, ALIAS]
    assert all(m["object"] == "model" and m["owned_by"] == "disan-serve" and m["created"] > 0
               for m in listing["data"])
    assert client.get(f"/v1/models/{ALIAS}").json()["id"] == ALIAS
    assert client.get("/v1/models/gpt-4").status_code == 404


def test_any_model_name_is_answered_by_the_served_model(client):
    name = client.get("/info").json()["model"]
    for model in (name, ALIAS, None, "text-embedding-ada-002", "gpt-4o"):
        body = {"input": "a man"} | ({"model": model} if model else {})
        r = client.post("/v1/embeddings", json=body)
        assert r.status_code == 200 and r.json()["model"] == name, model


def test_strict_mode_checks_model_with_an_openai_shaped_error(client, strict):
    name = strict.get("/info").json()["model"]
    for model in (name, ALIAS, None):
        body = {"input": "a man"} | ({"model": model} if model else {})
        assert strict.post("/v1/embeddings", json=body).status_code == 200, model
    r = strict.post("/v1/embeddings", json={"input": "a man", "model": "text-embedding-ada-002"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert set(error) == {"type", "message", "param", "code"}  # OpenAI's four fields, our type
    assert (error["type"], error["param"], error["code"]) == ("not_found", "model", "model_not_found")
    assert "text-embedding-ada-002" in error["message"] and name in error["message"]
    assert "model_aliases" in error["message"]
    # every other error keeps the two-field body
    assert set(client.post("/embed", json={"texts": []}).json()["error"]) == {"type", "message"}


def test_openapi_documents_the_new_routes_and_the_404(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/models", "/v1/models/{model}", "/tokenize", "/similarity"} <= set(paths)
    assert "404" in paths["/v1/embeddings"]["post"]["responses"]


def test_model_aliases_from_the_environment(monkeypatch, tiny_bundle):
    monkeypatch.setenv("DISAN_MODEL_ALIASES", "a, b")
    assert Settings(bundle=tiny_bundle).model_aliases == ["a", "b"]
    monkeypatch.setenv("DISAN_MODEL_ALIASES", '["c"]')
    assert Settings(bundle=tiny_bundle).model_aliases == ["c"]
