"""TEI's POST /decode on both front ends: the ids POST /tokenize gives come back as the text the
model read, one sequence or a batch; bad ids, empty and oversized requests get TEI's error body."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from support_serving import wait_ready

from service.main import create_app
from service.settings import Settings

TEXTS = ["A man is playing the guitar.", "The dog isn't in the park!"]


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, max_texts_per_request=4))
    with TestClient(app) as c:
        wait_ready(c.get)
        yield c


def tokenized(client, text: str) -> tuple[list[int], list[str]]:
    r = client.post("/tokenize", json={"inputs": text})
    assert r.status_code == 200, r.text
    (tokens,) = r.json()
    return [t["id"] for t in tokens], [t["text"] for t in tokens]


def test_the_ids_of_tokenize_decode_to_the_tokens_text(client):
    (ids, words), (ids2, words2) = (tokenized(client, t) for t in TEXTS)
    one = client.post("/decode", json={"ids": ids})
    assert one.status_code == 200, one.text
    assert one.json() == [" ".join(words)]  # a single sequence too gets a list, as TEI answers
    assert one.json() == ["a man is playing the guitar ."]
    batch = client.post("/decode", json={"ids": [ids, ids2]})
    assert batch.status_code == 200 and batch.json() == [" ".join(words), " ".join(words2)]


def test_special_tokens_are_left_out_unless_asked_for(client):
    ids, _ = tokenized(client, "a man")
    assert client.post("/decode", json={"ids": [0, *ids, 1]}).json() == ["a man"]
    kept = client.post("/decode", json={"ids": [*ids, 1], "skip_special_tokens": False})
    assert kept.json() == ["a man <unk>"]


def tei_error(r, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == "Validation", body
    return body["error"]


def test_an_id_the_model_lacks_is_named(client):
    ids, _ = tokenized(client, "a man")
    message = tei_error(client.post("/decode", json={"ids": [ids, [ids[0], 10**6]]}), 422)
    assert "ids[1]" in message and "1000000" in message


@pytest.mark.parametrize("body", [{"ids": []}, {"ids": [[]]}, {"ids": [-1]}, {"ids": ["a"]},
                                  {"ids": [[1], 2]}, {"ids": [2**31]}, {}, {"ids": [1.5]}])
def test_malformed_ids_are_refused_with_tei_body(client, body):
    assert "ids" in tei_error(client.post("/decode", json=body), 422)


def test_more_sequences_than_the_limit_are_refused(client):
    assert "at most 4" in tei_error(client.post("/decode", json={"ids": [[2]] * 5}), 413)
