"""Long texts on every route: windows pooled the way disan.text.windowing says, the policies, the
limits, explanations (both front ends, the tiny bundle served with a 6-token window)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from support_serving import wait_ready

from disan.text.windowing import EMBEDDING_LEAD, pool_windows, split_windows
from service.main import create_app
from service.settings import Settings

WORDS = "a man is playing the guitar and the movie was great . the dog runs in the park".split()  # 18
LONG = " ".join(WORDS)


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    with TestClient(create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, max_tokens=6))) as c:
        wait_ready(c.get)
        yield c


def windows_of(words: list[str], size: int, overlap: int = 0) -> tuple[list[str], list[int]]:
    """The texts of the windows the service cuts (one word = one token here) and their lengths."""
    cuts = split_windows(list(range(len(words))), size, overlap)
    return [" ".join(words[c[0]:c[-1] + 1]) for c in cuts], [len(c) for c in cuts]


def test_embed_pools_the_windows_token_weighted_the_first_counting_twice(client):
    texts, lengths = windows_of(WORDS, 6)
    assert lengths == [6, 6, 6]  # the last window ends at the text's end
    parts = np.asarray(client.post("/embed", json={"texts": texts}).json()["embeddings"])
    got = client.post("/embed", json={"texts": [LONG]}).json()
    assert EMBEDDING_LEAD == 2.0
    np.testing.assert_allclose(got["embeddings"][0], (2 * parts[0] + parts[1] + parts[2]) / 4, atol=1e-6)
    assert got["notes"] == [{"index": 0, "tokens": 18, "windows": 3, "truncated": False, "empty": False}]
    assert got["usage"]["tokens"] == 18


def test_overlap_setting_changes_the_cuts(tiny_bundle):
    with TestClient(create_app(Settings(bundle=tiny_bundle, max_tokens=6, window_overlap=2))) as c:
        wait_ready(c.get)
        texts, lengths = windows_of(WORDS, 6, 2)
        assert len(texts) == 4
        parts = np.asarray(c.post("/embed", json={"texts": texts}).json()["embeddings"])
        got = c.post("/embed", json={"texts": [LONG]}).json()["embeddings"][0]
        np.testing.assert_allclose(got, pool_windows(parts, lengths, EMBEDDING_LEAD), atol=1e-6)


def test_sentiment_pools_window_probabilities(client):
    texts, lengths = windows_of(WORDS, 6)
    parts = client.post("/sentiment", json={"texts": texts}).json()["results"]
    labels = list(parts[0]["scores"])
    probs = np.asarray([[p["scores"][k] for k in labels] for p in parts])
    got = client.post("/sentiment", json={"texts": [LONG]}).json()
    np.testing.assert_allclose([got["results"][0]["scores"][k] for k in labels],
                               pool_windows(probs, lengths), atol=1e-6)
    assert got["usage"]["tokens"] == 18
    refused = client.post("/sentiment", json={"texts": ["a man", LONG], "long_text": "error"})
    assert refused.status_code == 422 and "texts[1]: 18 tokens" in refused.json()["error"]["message"]


def test_nli_runs_the_head_on_pooled_vectors(client):
    pairs = [{"premise": LONG, "hypothesis": "a man is playing"}]
    r = client.post("/nli", json={"pairs": pairs})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["tokens"] == 18 + 4
    cut = client.post("/nli", json={"pairs": pairs, "long_text": "truncate"}).json()
    assert cut["usage"]["tokens"] == 6 + 4
    assert r.json()["results"][0]["scores"] != cut["results"][0]["scores"]


def test_explanations_need_texts_that_fit(client):
    r = client.post("/embed", json={"texts": ["a man", LONG, LONG], "explain": True})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert message.startswith("texts[1], texts[2]: longer than max_tokens")
    assert "long_text=truncate" in message
    assert client.post("/embed", json={"texts": [LONG], "explain": True, "truncate": True}).status_code == 200
    r = client.post("/nli", json={"pairs": [{"premise": LONG, "hypothesis": "a man"}], "explain": True})
    assert r.status_code == 422 and "pairs[0].premise" in r.json()["error"]["message"]


def test_an_empty_text_explains_as_the_one_unknown_word_the_model_saw(client):
    r = client.post("/embed", json={"texts": ["\t", "a man"], "explain": True})
    assert r.status_code == 200, r.text
    assert r.json()["explanations"][0] == {"tokens": ["<unk>"], "token_weights": [1.0]}
    r = client.post("/nli", json={"pairs": [{"premise": "\n", "hypothesis": "a man"}], "explain": True})
    assert r.status_code == 200, r.text
    explanation = r.json()["results"][0]["explanation"]
    assert explanation["premise"]["tokens"] == ["<unk>"] and len(explanation["premise"]["attribution"]) == 1
    hypothesis = explanation["hypothesis"]
    assert hypothesis["tokens"] == ["a", "man"] and len(hypothesis["attribution"]) == 2
    r = client.post("/sentiment", json={"texts": ["\u200b"], "explain": True})
    assert r.status_code == 200 and r.json()["results"][0]["explanation"]["tokens"] == ["<unk>"]
