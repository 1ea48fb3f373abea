"""service.http.fastpath answers exactly what FastAPI's routes answer, for good and bad requests."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from support_serving import wait_ready

from service.http.fastpath import bearer_credentials, is_json
from service.main import create_app
from service.settings import Settings

JSON = {"content-type": "application/json"}
KEY = {"authorization": "Bearer s3cret"}
# (path, body bytes, headers): valid requests of every route and every kind of bad body.
REQUESTS = [
    ("/embed", b'{"texts": ["a man is playing", "the movie was great"]}', JSON),
    ("/embed", b'{"texts": ["a man"], "normalize": true, "truncate": true}', JSON),
    ("/nli", b'{"pairs": [{"premise": "a man is playing", "hypothesis": "a man"}]}', JSON),
    ("/sentiment", b'{"texts": ["the movie was great"], "explain": true}', JSON),
    ("/v1/embeddings", b'{"input": "a man", "encoding_format": "base64", "model": "x"}', JSON),
    ("/v1/embeddings", b'{"input": ["a", "the dog"], "dimensions": 3}', JSON),
    ("/embed", b'{"texts": ["a man is playing"]}', {"content-type": "application/vnd.api+json"}),
    ("/embed", b'{"texts": ["a"]}', {}),  # no Content-Type
    ("/embed", b'{"texts": ["a"]}', {"content-type": "text/plain"}),
    ("/embed", b"", JSON),
    ("/embed", b'{"texts": [', JSON),
    ("/embed", b"\xff\xfe", JSON),
    ("/embed", b"[]", JSON),
    ("/embed", b'{"texts": []}', JSON),
    ("/embed", b'{"texts": ["ok", ""]}', JSON),
    ("/embed", b'{"texts": "not a list"}', JSON),
    ("/embed", b'{"texts": [3]}', JSON),
    ("/embed", b'{"texts": ["a"], "normalize": 1}', JSON),
    ("/embed", b'{"texts": ["a"], "extra": 1}', JSON),
    ("/embed", b'{"texts": ["   \\t "]}', JSON),
    ("/embed", json.dumps({"texts": ["a"] * 9}).encode(), JSON),
    ("/embed", json.dumps({"texts": ["word " * 20]}).encode(), JSON),
    ("/nli", b'{"pairs": [{"premise": "a"}]}', JSON),
    ("/sentiment", b'{"texts": ["a"], "explain": "yes"}', JSON),
    ("/v1/embeddings", b'{"input": [[1, 2]]}', JSON),
    ("/tokenize", b'{"texts": ["a man", "word word word word word word word"]}', JSON),
    ("/tokenize", b'{"texts": []}', JSON),
    ("/similarity", b'{"query": "a man", "texts": ["a dog", "a man"], "top_k": 1}', JSON),
    ("/similarity", b'{"pairs": [{"a": "a man", "b": "a dog"}]}', JSON),
    ("/similarity", b'{"texts": ["a man", "a dog"]}', JSON),
    ("/similarity", b'{"query": "a man"}', JSON),
    # Bombs: deep nesting (the fast path answered 500 at 1,000 levels) and too many JSON items.
    ("/embed", b'{"texts": ' + b"[" * 1000 + b"]" * 1000 + b"}", JSON),
    ("/embed", b'{"texts": [' + b"1," * 20_000 + b"1]}", JSON),
]


def answers(bundle, fast_path: bool, api_key: str | None = None, auth: dict | None = None) -> list:
    """(status, JSON body, selected headers) of every request in REQUESTS."""
    settings = Settings(bundle=bundle, fast_path=fast_path, api_key=api_key, openai_strict_model=True,
                        max_texts_per_request=8, max_tokens=6, max_wait_ms=0)
    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)
        out = []
        for path, body, headers in REQUESTS:
            r = client.post(path, content=body, headers={**headers, **(auth or {})})
            kept = {k: r.headers.get(k) for k in ("content-type", "www-authenticate", "retry-after")}
            out.append((path, body, r.status_code, r.json(), kept))
        out.append(client.get("/metrics").text.count('route="/embed"') > 0)
        return out


@pytest.mark.parametrize("api_key,auth", [(None, None), ("s3cret", KEY)], ids=["open", "key"])
def test_same_answers_as_fastapi(tiny_bundle, api_key, auth):
    fast = answers(tiny_bundle, True, api_key, auth)
    slow = answers(tiny_bundle, False, api_key, auth)
    assert fast[-1] and slow[-1]  # both are counted under the route template
    for f, s in zip(fast[:-1], slow[:-1], strict=True):
        assert f == s, f"{f[0]} {f[1][:60]!r}: fast path {f[2:]} vs FastAPI {s[2:]}"
    assert {f[2] for f in fast[:-1]} == {200, 400, 404, 413, 422}  # 404: model "x" is not served


@pytest.mark.parametrize("auth", [None, {"authorization": "Bearer wrong"}], ids=["no-key", "wrong-key"])
def test_key_is_checked_before_the_body_is_read(tiny_bundle, auth):
    """Without the right key every request is 401 on the fast path. FastAPI decodes the JSON
    before it runs the key check, so there undecodable or too deep bodies get their 400 first,
    and bodies the body policy refuses before parsing (too many JSON items) their 413."""
    fast = answers(tiny_bundle, True, "s3cret", auth)
    slow = answers(tiny_bundle, False, "s3cret", auth)
    assert {f[2] for f in fast[:-1]} == {401}
    assert all(f[4]["www-authenticate"] == "Bearer" for f in fast[:-1])
    for f, s in zip(fast[:-1], slow[:-1], strict=True):
        assert f == s or (s[2], s[3]["error"]["type"]) in {(400, "malformed_json"),
                                                           (413, "request_too_large")}, (f, s)


def test_bearer_credentials_follow_fastapi():
    assert bearer_credentials("Bearer abc") == "abc"
    assert bearer_credentials("bearer  abc ") == "abc"
    assert bearer_credentials("Basic abc") is None
    assert bearer_credentials("Bearer") is None
    assert bearer_credentials(None) is None


def test_is_json():
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8")
    assert is_json("application/merge-patch+json")
    assert not is_json("text/plain") and not is_json("") and not is_json(None)
    assert not is_json("application/x-www-form-urlencoded")


def scope(method: str = "POST", path: str = "/embed", headers: list | None = None) -> dict:
    return {"type": "http", "method": method, "path": path, "headers": headers or []}


@pytest.mark.parametrize("cors", [False, True], ids=["no-cors", "cors"])
def test_claims_only_inference_posts_and_leaves_cors_to_fastapi(tiny_bundle, cors):
    """The fast path runs ahead of FastAPI's middleware, so it must not take what needs it:
    other routes and methods, and (with CORS on) requests carrying an Origin."""
    origins = ["https://app.example"] if cors else []
    app = create_app(Settings(bundle=tiny_bundle, cors_origins=origins))
    claims = app.fast_path.claims
    assert all(claims(scope(path=p)) for p in ("/embed", "/nli", "/sentiment", "/v1/embeddings"))
    assert not claims(scope(method="GET")) and not claims(scope(method="OPTIONS"))
    assert not claims(scope(path="/embed/")) and not claims(scope(path="/metrics"))
    assert not claims({"type": "lifespan"}) and not claims(scope() | {"type": "websocket"})
    assert claims(scope(headers=[(b"origin", b"https://app.example")])) is not cors
    assert create_app(Settings(bundle=tiny_bundle, fast_path=False)).fast_path is None


def test_oversized_body_is_refused_before_it_is_read(tiny_bundle):
    """413 from the fast path's own limit: by Content-Length, and by counting a chunked upload."""
    app = create_app(Settings(bundle=tiny_bundle, max_request_bytes=1024))
    with TestClient(app) as client:
        r = client.post("/embed", content=b"{" + b" " * 2000 + b"}", headers=JSON)
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        assert r.headers["connection"] == "close"
        chunks = iter([b'{"texts": ["' + b"a " * 400, b"b " * 400 + b'"]}'])
        r = client.post("/embed", content=chunks, headers=JSON)
        assert r.status_code == 413 and "over 1024 bytes" in r.json()["error"]["message"]
        assert 'route="/embed",status="413"' in client.get("/metrics").text
