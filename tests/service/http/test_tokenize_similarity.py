"""POST /tokenize (the model's own tokens, ids and the count against the limit) and POST
/similarity (pairs, a query ranked against texts, the full matrix), on both front ends."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from support_serving import wait_ready

from disan.text.tokenizer import UNK, tokenize
from service.main import create_app
from service.settings import Settings

TEXTS = ["a man is playing the guitar", "the dog runs in the park", "a woman plays music", "a man"]


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, max_texts_per_request=8))
    with TestClient(app) as c:
        wait_ready(c.get)
        yield c


def unit(client, texts: list[str]) -> np.ndarray:
    r = client.post("/embed", json={"texts": texts, "normalize": True})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float64)


def test_tokenize_gives_our_tokens_ids_and_the_limit(client, tiny_vocab):
    long = " ".join(["a man"] * 70)  # 140 tokens, over the tiny bundle's 128
    r = client.post("/tokenize", json={"texts": ["A man isn't playing (the guitar).", long]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["max_tokens"] == 128 and body["model"] == client.get("/info").json()["model"]
    first, second = body["results"]
    assert first["tokens"] == ["a", "man", "is", "n't", "playing", "(", "the", "guitar", ")", "."]
    assert first["ids"] == tiny_vocab.ids(first["tokens"])
    assert first["count"] == 10 and first["over_limit"] is False
    assert first["unknown"] == [i for i, t in enumerate(first["tokens"]) if t not in tiny_vocab]
    assert second["count"] == 140 and len(second["tokens"]) == 140 and second["over_limit"] is True
    # the count is what the embedding routes charge
    assert first["tokens"] == tokenize("A man isn't playing -LRB- the guitar -RRB- .")
    usage = client.post("/embed", json={"texts": ["A man isn't playing (the guitar)."]}).json()["usage"]
    assert usage["tokens"] == first["count"]


def test_an_unknown_compound_is_read_as_its_known_words(client, tiny_vocab):
    """"dog-man" is not in the vocabulary but both its words are: the model reads them (not one
    UNK), and /tokenize shows what it reads, one id per token ("-" is not in the tiny vocabulary)."""
    assert "dog-man" not in tiny_vocab and "-" not in tiny_vocab
    got = client.post("/tokenize", json={"texts": ["a dog-man runs"]}).json()["results"][0]
    assert got["tokens"] == ["a", "dog", "man", "runs"] and got["ids"] == tiny_vocab.ids(got["tokens"])
    same = unit(client, ["a dog-man runs", "a dog man runs"])
    assert np.allclose(same[0], same[1], atol=1e-6)


def test_a_misspelt_word_is_read_as_the_known_word(client, tiny_vocab):
    """"playnig" and "guitarr" are one edit from known words: /tokenize shows the words the model
    reads, and the vectors are those of the text spelt right."""
    assert "playnig" not in tiny_vocab and "guitarr" not in tiny_vocab
    got = client.post("/tokenize", json={"texts": ["a man playnig the guitarr"]}).json()["results"][0]
    assert got["tokens"] == ["a", "man", "playing", "the", "guitar"]
    assert got["ids"] == tiny_vocab.ids(got["tokens"])
    same = unit(client, ["a man playnig the guitarr", "a man playing the guitar"])
    assert np.allclose(same[0], same[1], atol=1e-6)


def test_spelling_off_leaves_a_misspelt_word_unknown(tiny_bundle, tiny_vocab):
    app = create_app(Settings(bundle=tiny_bundle, spelling=False))
    with TestClient(app) as c:
        wait_ready(c.get)
        got = c.post("/tokenize", json={"texts": ["a man playnig the guitarr"]}).json()["results"][0]
    assert got["tokens"] == ["a", "man", "playnig", "the", "guitarr"]
    assert got["ids"][2] == got["ids"][4] == UNK and got["unknown"] == [2, 4]


def test_tokenize_limits_and_errors(client):
    assert client.post("/tokenize", json={"texts": ["a"] * 9}).status_code == 413
    assert client.post("/tokenize", json={"texts": ["x" * 100_001]}).status_code == 413
    assert client.post("/tokenize", json={"texts": []}).status_code == 422
    assert client.post("/tokenize", json={"text": "a"}).status_code == 422
    # only spaces: zero tokens (embedding it gives the empty text's vector)
    assert client.post("/tokenize", json={"texts": [" \t "]}).json()["results"][0]["count"] == 0


def test_similarity_pairs_match_the_embeddings(client):
    pairs = [{"a": TEXTS[0], "b": TEXTS[2]}, {"a": TEXTS[1], "b": TEXTS[1]}, {"a": TEXTS[3], "b": TEXTS[1]}]
    r = client.post("/similarity", json={"pairs": pairs})
    assert r.status_code == 200, r.text
    body = r.json()
    vecs = unit(client, TEXTS)
    want = [vecs[0] @ vecs[2], 1.0, vecs[3] @ vecs[1]]
    np.testing.assert_allclose(body["scores"], want, atol=1e-5)
    assert set(body) == {"model", "scores", "usage"}


def test_similarity_query_ranks_texts_best_first(client):
    r = client.post("/similarity", json={"query": TEXTS[0], "texts": TEXTS})
    assert r.status_code == 200, r.text
    ranking = r.json()["ranking"]
    vecs = unit(client, TEXTS)
    scores = vecs @ vecs[0]
    assert [x["index"] for x in ranking] == list(np.argsort(-scores, kind="stable"))
    assert ranking[0]["index"] == 0 and ranking[0]["score"] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose([x["score"] for x in ranking], np.sort(scores)[::-1], atol=1e-5)
    top = client.post("/similarity", json={"query": TEXTS[0], "texts": TEXTS, "top_k": 2}).json()["ranking"]
    assert top == ranking[:2]


def test_similarity_matrix_of_texts(client):
    r = client.post("/similarity", json={"texts": TEXTS})
    assert r.status_code == 200, r.text
    matrix = np.asarray(r.json()["matrix"])
    vecs = unit(client, TEXTS)
    np.testing.assert_allclose(matrix, vecs @ vecs.T, atol=1e-5)
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-6)


@pytest.mark.parametrize("body", [
    {},
    {"pairs": [{"a": "x", "b": "y"}], "texts": ["z"]},
    {"pairs": [{"a": "x", "b": "y"}], "query": "z"},
    {"query": "a man"},
    {"texts": ["a man"], "top_k": 1},
    {"query": "a man", "texts": ["a"], "top_k": 0},
    {"pairs": [{"a": "x"}]},
    {"texts": []},
])
def test_similarity_bad_forms_are_422(client, body):
    r = client.post("/similarity", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "invalid_request"


def test_similarity_limits(client):
    assert client.post("/similarity", json={"pairs": [{"a": "a", "b": "b"}] * 9}).status_code == 413
    assert client.post("/similarity", json={"texts": ["a"] * 9}).status_code == 413
    long = " ".join(["a man"] * 70)
    pairs = [{"a": "a man", "b": long}]
    refused = client.post("/similarity", json={"pairs": pairs, "long_text": "error"})
    assert refused.status_code == 422
    assert refused.json()["error"]["message"].startswith("pairs[0].b: 140 tokens")
    assert client.post("/similarity", json={"pairs": pairs, "truncate": True}).status_code == 200
    windowed = client.post("/similarity", json={"pairs": pairs})  # the default: windows pooled
    assert windowed.status_code == 200 and windowed.json()["usage"]["tokens"] == 2 + 140
