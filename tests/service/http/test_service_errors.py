"""Every row of the error table, end to end, with the stable body {"error": {"type", "message"}}."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from support_serving import block_runner, until_loaded, wait_failed, wait_ready

from disan.bundle.manifest import write_manifest
from service.common.errors import ERROR_TABLE
from service.inference.engine import Engine
from service.main import create_app
from service.settings import Settings


@contextmanager
def serve(bundle, ready: bool = True, **overrides):
    with TestClient(create_app(Settings(bundle=bundle, **overrides))) as c:
        if ready:
            wait_ready(c.get)
        yield c


def assert_error(r, status: int, etype: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == etype and ERROR_TABLE[etype][0] == status
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    with serve(tiny_bundle, fast_path=fast_path, max_texts_per_request=8, max_chars_per_text=200,
               max_tokens=6, max_request_bytes=64 * 1024) as c:
        yield c


@pytest.mark.parametrize("payload", [
    {"texts": []}, {"texts": [""]}, {"texts": ["ok", ""]}, {"texts": "not a list"}, {"texts": [3]},
    {}, {"texts": ["a"], "extra": 1},
])
def test_invalid_input_is_422(client, payload):
    assert_error(client.post("/embed", json=payload), 422, "invalid_request")


def test_nli_and_openai_validation(client):
    assert_error(client.post("/nli", json={"pairs": []}), 422, "invalid_request")
    assert_error(client.post("/nli", json={"pairs": [{"premise": "a"}]}), 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": []}), 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": ""}), 422, "invalid_request")
    assert_error(client.post("/v1/embeddings", json={"input": [[1, 2]]}), 422, "invalid_request")


def test_long_texts_are_windowed_by_default_refused_with_long_text_error(client):
    long = "a man is playing the guitar and the movie was great"  # 11 tokens > 6
    r = client.post("/embed", json={"texts": ["a man", long]})
    assert r.status_code == 200 and r.json()["usage"]["tokens"] == 2 + 11
    assert r.json()["notes"] == [{"index": 1, "tokens": 11, "windows": 2, "truncated": False, "empty": False}]
    err = assert_error(client.post("/embed", json={"texts": [long, "a man", long], "long_text": "error"}),
                       422, "invalid_request")
    assert "texts[0]: 11 tokens, at most 6" in err["message"] and "texts[2]: 11 tokens" in err["message"]
    assert "long_text=window" in err["message"] and "texts[1]" not in err["message"]
    r = client.post("/embed", json={"texts": [long], "truncate": True})
    assert r.status_code == 200 and r.json()["usage"]["tokens"] == 6
    assert r.json()["notes"][0]["truncated"]
    cut = client.post("/embed", json={"texts": ["a man is playing the guitar"]}).json()
    assert r.json()["embeddings"] == cut["embeddings"]  # truncation = the first max_tokens tokens
    again = client.post("/embed", json={"texts": [long], "long_text": "truncate"}).json()
    assert again["embeddings"] == cut["embeddings"]


def test_texts_of_only_spaces_or_controls_are_embedded_as_the_empty_text(client):
    texts = ["a man", "\n\n", "\t", "\u200b", "\x00\x01"]
    r = client.post("/embed", json={"texts": texts})
    assert r.status_code == 200, r.text
    vectors = r.json()["embeddings"]
    assert vectors[1] == vectors[2] == vectors[3] == vectors[4] != vectors[0]
    assert [n["index"] for n in r.json()["notes"] if n["empty"]] == [1, 2, 3, 4]
    assert r.json()["usage"]["tokens"] == 2


def test_every_offending_item_is_named(client):
    err = assert_error(client.post("/embed", json={"texts": ["a", "", "b", 3, "", "c", "", ""]}), 422,
                       "invalid_request")
    assert "texts[1], texts[4], texts[6], texts[7]: String should have at least 1 character" in err["message"]
    assert "texts[3]: Input should be a valid string" in err["message"]
    err = assert_error(client.post("/embed", json={"texts": ["a" * 201, "ok", "b" * 300]}), 413,
                       "request_too_large")
    assert "texts[0]: 201 characters" in err["message"] and "texts[2]: 300 characters" in err["message"]


def test_per_text_and_per_request_token_limits_are_413_before_inference(tiny_bundle, fast_path):
    with serve(tiny_bundle, fast_path=fast_path, max_tokens=4, max_tokens_per_text=10,
               max_tokens_per_request=20) as c:
        words = "a man is playing the guitar and the movie was great ."
        err = assert_error(c.post("/embed", json={"texts": [words, "a man", words]}), 413,
                           "request_too_large")
        assert "texts[0]: 12 tokens, at most 10 per text" in err["message"] and "texts[2]" in err["message"]
        assert c.post("/embed", json={"texts": ["a man is playing the guitar"] * 3}).status_code == 200
        err = assert_error(c.post("/embed", json={"texts": ["a man is playing the guitar"] * 4}), 413,
                           "request_too_large")
        assert "24 tokens in the request, at most 20" in err["message"]


def test_too_many_texts_or_chars_is_413(client):
    assert_error(client.post("/embed", json={"texts": ["a"] * 9}), 413, "request_too_large")
    assert_error(client.post("/embed", json={"texts": ["a" * 201]}), 413, "request_too_large")
    pairs = [{"premise": "a", "hypothesis": "b"}] * 9
    assert_error(client.post("/nli", json={"pairs": pairs}), 413, "request_too_large")
    assert_error(client.post("/sentiment", json={"texts": ["b" * 201], "truncate": True}), 413,
                 "request_too_large")


def test_huge_bodies_are_refused_before_parsing(client):
    megabyte = "x" * (1 << 20)
    assert_error(client.post("/embed", json={"texts": [megabyte]}), 413, "request_too_large")
    assert_error(client.post("/embed", json={"texts": ["a"] * 10_000}), 413, "request_too_large")

    def chunks():  # no Content-Length: the middleware must count streamed bytes
        yield b'{"texts": ["'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"]}'

    r = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413, "request_too_large")
    assert client.get("/health").status_code == 200  # still up


def test_10k_items_and_1mb_string_within_byte_limit(tiny_bundle, fast_path):
    """With a generous byte limit the count/character limits still reject them cheaply."""
    with serve(tiny_bundle, fast_path=fast_path, max_request_bytes=8 << 20) as c:
        t0 = time.perf_counter()
        assert_error(c.post("/embed", json={"texts": ["word"] * 10_000}), 413, "request_too_large")
        assert_error(c.post("/embed", json={"texts": ["x " * (1 << 19)]}), 413, "request_too_large")
        assert time.perf_counter() - t0 < 10
        assert c.post("/embed", json={"texts": ["still fine"]}).status_code == 200


def test_malformed_json_is_400(client):
    headers = {"content-type": "application/json"}
    assert_error(client.post("/embed", content=b'{"texts": [', headers=headers), 400, "malformed_json")
    assert_error(client.post("/embed", content=b"\xff\xfe", headers=headers), 400, "malformed_json")
    assert_error(client.post("/nli", content=b"texts=a",
                             headers={"content-type": "application/x-www-form-urlencoded"}),
                 400, "malformed_json")


def test_unknown_route_and_method(client):
    assert_error(client.get("/nope"), 404, "not_found")
    assert_error(client.get("/embed"), 405, "method_not_allowed")


def test_api_key(tiny_bundle, fast_path):
    with serve(tiny_bundle, fast_path=fast_path, api_key="s3cret") as c:
        assert_error(c.post("/embed", json={"texts": ["a"]}), 401, "unauthorized")
        r = c.post("/embed", json={"texts": ["a"]}, headers={"Authorization": "Bearer wrong"})
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(c.get("/info"), 401, "unauthorized")
        ok = c.post("/embed", json={"texts": ["a"]}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200


def test_queue_full_is_429_with_retry_after(tiny_bundle, fast_path):
    # One ORT call at a time, so a blocked call leaves the next request's items in the queue.
    with serve(tiny_bundle, fast_path=fast_path, max_texts_per_request=4, queue_limit=4, max_batch_size=4,
               max_wait_ms=0, batch_concurrency=1) as c:
        batcher = c.app.state.engine.batchers["encoder"]
        gate, entered = block_runner(batcher)
        results: list[int] = []
        workers = [threading.Thread(target=lambda: results.append(
            c.post("/embed", json={"texts": ["a", "b", "c", "d"]}).status_code)) for _ in range(2)]
        workers[0].start()
        assert entered.wait(10)  # first request is inside the runner; the queue is empty again
        workers[1].start()
        deadline = time.monotonic() + 10
        while batcher.depth < 4:  # second request fills the queue
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = c.post("/embed", json={"texts": ["e"]})
        assert_error(r, 429, "overloaded")
        assert int(r.headers["retry-after"]) >= 1
        gate.set()
        for w in workers:
            w.join(10)
        assert results == [200, 200]


def test_not_ready_is_503(tiny_bundle, monkeypatch, fast_path):
    release = threading.Event()
    real = Engine._load_sync

    def slow_load(self):
        release.wait(10)
        return real(self)

    monkeypatch.setattr(Engine, "_load_sync", slow_load)
    with serve(tiny_bundle, ready=False, fast_path=fast_path) as c:
        assert c.get("/health").status_code == 200
        r = c.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert_error(c.post("/embed", json={"texts": ["a"]}), 503, "not_ready")
        assert_error(c.post("/v1/embeddings", json={"input": "a"}), 503, "not_ready")
        release.set()
        wait_ready(c.get)
        assert c.post("/embed", json={"texts": ["a"]}).status_code == 200


def test_broken_bundle_reports_failed(tmp_path):
    with serve(tmp_path, ready=False) as c:
        wait_failed(c.get, timeout=10)
        assert_error(c.post("/nli", json={"pairs": [{"premise": "a", "hypothesis": "b"}]}),
                     503, "not_ready")


def test_inference_failure_is_500_without_details(tiny_bundle, caplog, fast_path):
    with serve(tiny_bundle, fast_path=fast_path) as c:
        batcher = c.app.state.engine.batchers["sentiment"]
        real = batcher.runner

        def broken(rows):
            raise RuntimeError("secret internal detail /models/x")

        batcher.runner = broken
        err = assert_error(c.post("/sentiment", json={"texts": ["a"]}), 500, "internal_error")
        assert "secret" not in err["message"]
        assert any("secret internal detail" in rec.getMessage() for rec in caplog.records)
        batcher.runner = real  # the worker survived the failure
        assert c.post("/sentiment", json={"texts": ["a"]}).status_code == 200


def test_cors_origins(tiny_bundle, fast_path):
    with serve(tiny_bundle, fast_path=fast_path, cors_origins=["https://app.example"]) as c:
        r = c.options("/embed", headers={"Origin": "https://app.example",
                                         "Access-Control-Request-Method": "POST"})
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        post = c.post("/embed", json={"texts": ["a"]}, headers={"Origin": "https://app.example"})
        assert post.status_code == 200
        assert post.headers["access-control-allow-origin"] == "https://app.example"
        other = c.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_client_disconnect_cancels_its_queued_sentences(tiny_bundle, fast_path):
    """A request whose client leaves while it waits in the queue is answered 499 and never run."""
    async def main():
        app = create_app(Settings(bundle=tiny_bundle, max_wait_ms=0, max_batch_size=1,
                                  batch_concurrency=1, fast_path=fast_path))
        service = app.state.engine
        await service.start()
        await until_loaded(service)
        batcher = service.batchers["encoder"]
        gate, seen = threading.Event(), []
        real = batcher.runner

        def blocked(rows):
            seen.extend(tuple(r) for r in rows)
            gate.wait(10)
            return real(rows)

        batcher.runner = blocked

        async def call(texts, leave: asyncio.Event | None):
            body = json.dumps({"texts": texts}).encode()
            sent: list[dict] = []
            first = True

            async def receive():
                nonlocal first
                if first:
                    first = False
                    return {"type": "http.request", "body": body, "more_body": False}
                if leave is not None:
                    await leave.wait()
                else:
                    await asyncio.Event().wait()  # this client never leaves
                return {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            scope = {"type": "http", "method": "POST", "path": "/embed", "raw_path": b"/embed",
                     "query_string": b"", "headers": [(b"content-type", b"application/json")],
                     "http_version": "1.1", "scheme": "http", "server": ("test", 80),
                     "client": ("test", 1), "root_path": "", "asgi": {"version": "3.0"}}
            await app(scope, receive, send)
            return next(m["status"] for m in sent if m["type"] == "http.response.start")

        leave = asyncio.Event()
        first = asyncio.ensure_future(call(["a man"], None))  # occupies the worker
        while not seen:
            await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(call(["the movie was great"], leave))
        while batcher.depth == 0:
            await asyncio.sleep(0.01)
        leave.set()
        gone_status = await gone
        gate.set()
        first_status = await first
        await service.stop()
        return first_status, gone_status, seen, service.runtime.vocab

    first_status, gone_status, seen, vocab = asyncio.run(main())
    assert first_status == 200 and gone_status == 499
    gone_ids = tuple(vocab.ids(["the", "movie", "was", "great"]))
    assert gone_ids not in seen and len(seen) == 1


def test_bundle_variants(tiny_bundle, tmp_path, caplog):
    manifest = json.loads((tiny_bundle / "manifest.json").read_text())
    variants = {v for graph_set in manifest["sets"].values() for v in graph_set["variants"]}
    for variant in sorted(variants):  # whatever the shared fixture exported (fp32, int8, fp16)
        with serve(tiny_bundle, variant=variant) as c:
            assert c.get("/info").json()["variant"] == variant
            assert c.post("/embed", json={"texts": ["a man is playing"]}).status_code == 200
    # A bundle without an int8 variant refuses --variant int8 with a clear reason.
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in tiny_bundle.iterdir():
        if f.name != "manifest.json" and ".int8." not in f.name:
            (plain / f.name).write_bytes(f.read_bytes())
    del manifest["sets"]["cpu"]["variants"]["int8"]
    write_manifest(plain, {k: v for k, v in manifest.items() if k != "files"})
    with serve(plain, ready=False, variant="int8") as c:
        deadline = time.monotonic() + 10
        while c.get("/health").status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # The reason is logged; /health and /ready (open without the API key) never show the
        # bundle's path or onnxruntime's text.
        for route in ("/health", "/ready"):
            detail = c.get(route).json()["detail"]
            assert str(plain) not in detail and "variant" not in detail and "server log" in detail
        assert any("no int8 graphs" in rec.getMessage() for rec in caplog.records)
