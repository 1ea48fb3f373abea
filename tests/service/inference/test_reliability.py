"""Hostile and overloaded clients, on both request paths (fast path and FastAPI's): admission
before the body is read, JSON bombs, explain limits, body timeout, error locations, the API docs
behind the key, the honest `dimensions` schema, route labels, timing headers and histograms."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from support_serving import block_runner, until_loaded, wait_ready

from service.common.errors import ERROR_TABLE, format_loc
from service.main import create_app
from service.settings import Settings

SCOPE = {"type": "http", "method": "POST", "raw_path": b"", "query_string": b"", "http_version": "1.1",
         "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": "",
         "asgi": {"version": "3.0"}}


@contextmanager
def serve(bundle, **overrides):
    with TestClient(create_app(Settings(bundle=bundle, **overrides))) as c:
        wait_ready(c.get)
        yield c


def assert_error(r, status: int, etype: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["type"] == etype and ERROR_TABLE[etype][0] == status
    return body["error"]["message"]


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    with serve(tiny_bundle, fast_path=fast_path, max_explain_texts=2, max_explain_tokens=8,
               max_texts_per_request=8) as c:
        yield c


# ------------------------------------------------------------------ admission control
def test_over_the_limit_is_refused_before_the_body_is_read(tiny_bundle, fast_path):
    """With every slot taken, a request is answered 429 + Retry-After without a single
    `receive()`: nothing of it is read, parsed or tokenized (admission did not exist before)."""
    async def main():
        app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, max_concurrent_requests=1,
                                  admission_wait_s=0.2, batch_concurrency=1, max_wait_ms=0))
        engine = app.state.engine
        await engine.start()
        await until_loaded(engine)
        batcher = engine.batchers["encoder"]
        gate, entered = block_runner(batcher)

        async def call(reads: list[int]):
            sent: list[dict] = []
            body = json.dumps({"texts": ["a man is playing"]}).encode()

            async def receive():
                reads.append(1)
                if len(reads) == 1:
                    return {"type": "http.request", "body": body, "more_body": False}
                await asyncio.Event().wait()  # the client stays

            async def send(message):
                sent.append(message)

            scope = {**SCOPE, "path": "/embed", "headers": [(b"content-type", b"application/json")]}
            await app(scope, receive, send)
            start = next(m for m in sent if m["type"] == "http.response.start")
            return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent)

        first_reads: list[int] = []
        first = asyncio.ensure_future(call(first_reads))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        refused_reads: list[int] = []
        t0 = time.perf_counter()
        refused = await call(refused_reads)
        refused_s = time.perf_counter() - t0
        gate.set()
        admitted = await first
        await engine.stop()
        return admitted, refused, refused_reads, refused_s, app.state.admission.active

    admitted, refused, refused_reads, refused_s, active = asyncio.run(main())
    assert admitted[0] == 200 and active == 0
    status, headers, body = refused
    assert status == 429 and json.loads(body)["error"]["type"] == "overloaded"
    assert int(headers[b"retry-after"]) >= 1
    # Answered after waiting admission_wait_s for room (a wait that costs no CPU), still unread.
    assert refused_reads == [] and 0.15 < refused_s < 1.0


def test_admission_slots_are_given_back(client):
    for _ in range(3):
        assert client.post("/embed", json={"texts": ["a man"]}).status_code == 200
        assert_error(client.post("/embed", json={"texts": []}), 422, "invalid_request")
        assert_error(client.post("/embed", content=b"{", headers={"content-type": "application/json"}),
                     400, "malformed_json")
    assert client.app.state.admission.active == 0


# ------------------------------------------------------------------ JSON bombs
@pytest.mark.parametrize("levels", [40, 1_000, 100_000])
def test_deep_json_is_400_never_500(client, levels):
    body = b'{"texts": ' + b"[" * levels + b"]" * levels + b"}"
    assert_error(client.post("/embed", content=body, headers={"content-type": "application/json"}),
                 400, "malformed_json")


def test_shallow_nesting_and_brackets_in_texts_are_fine(client):
    texts = ["[[[[ {{{{ ,,,, ]]]] }}}}" * 3] * 8
    assert client.post("/embed", json={"texts": texts}).status_code == 200
    pairs = [{"premise": "a man", "hypothesis": "a dog"}] * 8
    assert client.post("/nli", json={"pairs": pairs}).status_code == 200


@pytest.mark.parametrize("item", [b"1", b"{}", b'"ab"', b"[]"])
def test_json_item_bombs_are_413_before_parsing(client, item):
    """A 4 MiB-ish body of tiny items made json + pydantic allocate gigabytes (one error per item);
    items outside strings are counted before parsing."""
    n = 20_000
    body = b'{"texts": [' + b",".join([item] * n) + b"]}"
    t0 = time.perf_counter()
    message = assert_error(client.post("/embed", content=body, headers={"content-type": "application/json"}),
                           413, "request_too_large")
    assert "JSON items" in message and time.perf_counter() - t0 < 2


# ------------------------------------------------------------------ explain is bounded
def test_explain_texts_and_tokens_are_bounded_before_inference(client):
    batcher = client.app.state.engine.batchers["sentiment_explain"]
    real, calls = batcher.runner, []
    batcher.runner = lambda rows: calls.append(len(rows)) or real(rows)
    try:
        message = assert_error(client.post("/sentiment", json={"texts": ["a"] * 3, "explain": True}),
                               413, "request_too_large")
        assert "explain" in message
        long = "the movie was great and the acting was good"  # 9 tokens: over the 8 allowed
        assert_error(client.post("/sentiment", json={"texts": [long], "explain": True}),
                     413, "request_too_large")
        assert calls == []
        ok = client.post("/sentiment", json={"texts": ["a man", "the dog"], "explain": True})
        assert ok.status_code == 200 and sum(calls) == 2
        # Without explain the normal limits apply.
        assert client.post("/sentiment", json={"texts": [long] * 3}).status_code == 200
    finally:
        batcher.runner = real


# ------------------------------------------------------------------ slow bodies
def test_a_body_that_never_finishes_is_408(tiny_bundle, fast_path):
    async def main():
        app = create_app(Settings(bundle=tiny_bundle, fast_path=fast_path, body_timeout_s=0.2))
        await app.state.engine.start()
        await until_loaded(app.state.engine)
        sent: list[dict] = []
        calls = 0

        async def receive():
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": b'{"texts": ["a', "more_body": True}
            await asyncio.Event().wait()  # the rest never comes

        async def send(message):
            sent.append(message)

        scope = {**SCOPE, "path": "/embed", "headers": [(b"content-type", b"application/json")]}
        t0 = time.perf_counter()
        await asyncio.wait_for(app(scope, receive, send), 5)
        elapsed = time.perf_counter() - t0
        await app.state.engine.stop()
        return sent, elapsed, app.state.admission.active

    sent, elapsed, active = asyncio.run(main())
    start = sent[0]
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"]
    assert json.loads(sent[1]["body"])["error"]["type"] == "request_timeout"
    assert 0.15 < elapsed < 2 and active == 0


# ------------------------------------------------------------------ one notation for locations
@pytest.mark.parametrize("path,payload,loc", [
    ("/embed", {"texts": ["ok", ""]}, "texts[1]"),
    ("/embed", {"texts": ["ok", 3]}, "texts[1]"),
    ("/nli", {"pairs": [{"premise": "a", "hypothesis": "b"}, {"premise": "a"}]}, "pairs[1].hypothesis"),
    ("/nli", {"pairs": [{"premise": "a", "hypothesis": "b"}, {"premise": "a", "hypothesis": ""}]},
     "pairs[1].hypothesis"),
    ("/v1/embeddings", {"input": ["a", 5]}, "input[1]"),
    ("/v1/embeddings", {"input": 5}, "input"),
    ("/v1/embeddings", {"input": ["a", ""]}, "input[1]"),
    ("/v1/embeddings", {"input": ""}, "input"),  # one string: no index
    ("/similarity", {"query": "", "texts": ["a"]}, "query"),
    ("/similarity", {"pairs": [{"a": "a", "b": "b"}, {"a": "a", "b": ""}]}, "pairs[1].b"),
])
def test_error_locations_use_one_notation(client, path, payload, loc):
    message = assert_error(client.post(path, json=payload), 422, "invalid_request")
    assert message.startswith(f"{loc}:"), message
    assert "constrained" not in message and "texts.1" not in message


def test_format_loc():
    assert format_loc(("body", "texts", 0)) == "texts[0]"
    assert format_loc(("pairs", 3, "premise")) == "pairs[3].premise"
    assert format_loc(("input", "list[constrained-str]", 1)) == "input[1]"
    assert format_loc(("input", "constrained-str")) == "input"
    assert format_loc(()) == "body"


# ------------------------------------------------------------------ docs, OpenAPI
def test_api_docs_need_the_key_when_one_is_set(tiny_bundle, fast_path):
    with serve(tiny_bundle, fast_path=fast_path, api_key="s3cret") as c:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert_error(c.get(path), 401, "unauthorized")
            assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for path in ("/health", "/ready", "/metrics"):  # probes and scrapers carry no key
            assert c.get(path).status_code == 200
    with serve(tiny_bundle, fast_path=fast_path) as c:
        assert c.get("/openapi.json").status_code == 200 and c.get("/docs").status_code == 200


def test_openapi_dimensions_accepts_only_the_model_dim(client):
    dim = client.get("/info").json()["dim"]
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    dims = next(m["properties"]["dimensions"] for m in schemas.values()
                if "dimensions" in m.get("properties", {}))
    assert {"type": "integer", "enum": [dim]} in dims["anyOf"]
    assert all(branch.get("minimum") is None for branch in dims["anyOf"])
    assert client.post("/v1/embeddings", json={"input": "a", "dimensions": dim}).status_code == 200
    assert_error(client.post("/v1/embeddings", json={"input": "a", "dimensions": dim + 1}),
                 422, "invalid_request")


# ------------------------------------------------------------------ observability
def test_every_real_route_has_its_own_label(client):
    for path in ("/docs", "/openapi.json", "/redoc", "/health", "/no/such/route"):
        client.get(path)
    text = client.get("/metrics").text
    for route in ("/docs", "/openapi.json", "/redoc", "/health"):
        assert f'route="{route}"' in text, route
    assert 'route="/no/such/route"' not in text and 'route="unmatched"' in text


def test_timing_headers_and_histograms(client):
    r = client.post("/embed", json={"texts": ["a man is playing", "the dog"]})
    assert r.status_code == 200
    times = {h: float(r.headers[h]) for h in ("x-queue-time", "x-inference-time", "x-tokenization-time")}
    assert all(v >= 0 for v in times.values()) and times["x-inference-time"] > 0
    assert "x-queue-time" not in client.post("/embed", json={"texts": []}).headers
    text = client.get("/metrics").text
    for name in ("disan_request_queue_seconds", "disan_request_inference_seconds",
                 "disan_request_tokenize_seconds", "disan_request_tokens", "disan_batch_size"):
        assert f"{name}_count" in text, name
    tokens = [line for line in text.splitlines()
              if line.startswith('disan_request_tokens_sum{route="/embed"}')]
    assert tokens and float(tokens[0].split()[-1]) >= 6  # 4 + 2 tokens at least


def test_admission_rules():
    """The request limit holds every request; the queue-wait limit only bodies over SMALL_BODY
    (or of unknown size): small requests pass big ones in the batcher anyway."""
    from service.common.errors import Overloaded
    from service.inference.admission import SMALL_BODY, Admission

    queued = [0.0]
    admission = Admission(limit=2, max_queue_wait_s=1.0, queued_seconds=lambda: queued[0])

    async def main():
        await admission.admit(5000)
        admission.enter()
        admission.enter()
        with pytest.raises(Overloaded):
            await admission.admit(10)
        with pytest.raises(Overloaded):
            admission.enter()
        admission.leave()
        queued[0] = 3.5
        await admission.admit(SMALL_BODY)  # a small request passes a long queue
        with pytest.raises(Overloaded) as refused:
            await admission.admit(SMALL_BODY + 1)
        assert refused.value.headers["Retry-After"] == "4"
        with pytest.raises(Overloaded):
            await admission.admit(None)  # a chunked upload of unknown size counts as big
        admission.leave()
        assert admission.active == 0

    asyncio.run(main())


def test_waiting_requests_are_admitted_newest_first_or_refused_after_the_wait():
    from service.common.errors import Overloaded
    from service.inference.admission import Admission

    async def main():
        admission = Admission(limit=1, wait_s=0.3)
        admission.enter()  # the only slot is taken
        order: list[str] = []

        async def request(name: str) -> None:
            try:
                await admission.admit(100)
            except Overloaded:
                order.append(f"{name} refused")
                return
            admission.enter()
            order.append(f"{name} admitted")
            await asyncio.sleep(0.05)
            admission.leave()

        t0 = time.perf_counter()
        waiting = [asyncio.ensure_future(request(n)) for n in ("old", "mid", "new")]
        await asyncio.sleep(0.05)
        admission.leave()  # room for one: the newest waiter gets it, then the next newest
        await asyncio.gather(*waiting)
        return order, time.perf_counter() - t0

    order, seconds = asyncio.run(main())
    assert order == ["new admitted", "mid admitted", "old admitted"], order
    assert seconds < 1.0

    async def refused():
        admission = Admission(limit=1, wait_s=0.2)
        admission.enter()
        t0 = time.perf_counter()
        with pytest.raises(Overloaded):
            await admission.admit(100)
        return time.perf_counter() - t0, admission._waiting

    waited, left = asyncio.run(refused())
    assert 0.15 < waited < 1.0 and left == []
