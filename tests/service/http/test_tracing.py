"""OpenTelemetry traces (service.http.tracing), with the SDK's in-memory exporter and a live OTLP/HTTP
receiver: one server span per request with its tokenize/queue/inference children, the caller's
`traceparent` honoured, both front ends alike; off, nothing of the SDK is needed."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from support_serving import wait_ready

from disan.optional import MissingDependency
from service.common.metrics import RouteLabels
from service.http.endpoints import HANDLERS
from service.http.tracing import FLUSH_S, TRACES_PATH, Tracing, protocol, traces_endpoint
from service.main import create_app
from service.settings import Settings

REASON = "the tracing extra is not installed (pip install -e '.[tracing]')"
ENDPOINT = "http://127.0.0.1:4318"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
OTEL_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME",
            "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "DISAN_OTLP_ENDPOINT", "DISAN_OTLP_SERVICE_NAME")


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch):
    """These tests say which OTEL_* variables are set (a developer's shell may have some)."""
    for name in OTEL_ENV:
        monkeypatch.delenv(name, raising=False)


def in_memory():
    sdk = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter", reason=REASON)
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=REASON)
    return sdk.InMemorySpanExporter()


def traced_app(bundle, exporter, **settings):
    """The app as `disan serve` builds it with an endpoint set, spans going to `exporter`."""
    app = create_app(Settings(**{"bundle": bundle, "max_wait_ms": 1.0, **settings}))
    app.tracing = Tracing(Settings(otlp_endpoint=ENDPOINT), exporter=exporter,
                          route_of=RouteLabels(app.router.routes), paths=HANDLERS)
    return app


@pytest.fixture(scope="module")
def traced(tiny_bundle, fast_path):
    """(client, its exporter): the app's shutdown stops the exporter, so each app has its own."""
    exporter = in_memory()
    with TestClient(traced_app(tiny_bundle, exporter, fast_path=fast_path)) as c:
        wait_ready(c.get)
        yield c, exporter


def spans_of(exporter, call):
    """The spans `call()` produced: (its response, [server span], {id: children})."""
    exporter.clear()
    response = call()
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind.name == "SERVER"]
    return response, servers, [s for s in spans if s.kind.name != "SERVER"]


def test_a_request_is_one_server_span_with_tokenize_queue_and_inference(traced):
    client, exporter = traced
    texts = ["a man is playing a guitar", "the movie was great"]
    r, servers, children = spans_of(exporter, lambda: client.post("/embed", json={"texts": texts}))
    assert r.status_code == 200, r.text
    tokens = r.json()["usage"]["tokens"]
    (server,) = servers
    assert server.name == "POST /embed"
    attrs = dict(server.attributes)
    assert attrs["http.request.method"] == "POST" and attrs["http.route"] == "/embed"
    assert attrs["url.path"] == "/embed" and attrs["http.response.status_code"] == 200
    assert attrs["disan.tokens"] == tokens and server.status.is_ok
    assert sorted(s.name for s in children) == ["inference", "queue", "tokenize"]
    by_name = {s.name: s for s in children}
    for child in children:
        assert child.parent.span_id == server.context.span_id
        assert child.context.trace_id == server.context.trace_id
        assert server.start_time <= child.start_time <= child.end_time <= server.end_time
    tokenize, queue, inference = by_name["tokenize"], by_name["queue"], by_name["inference"]
    assert dict(tokenize.attributes) == {"disan.texts": 2, "disan.rows": 2, "disan.tokens": tokens}
    assert tokenize.end_time <= queue.start_time and queue.end_time == inference.start_time
    assert queue.attributes["disan.graph"] == inference.attributes["disan.graph"] == "encoder"
    assert inference.attributes["disan.rows"] == 2 and inference.attributes["disan.tokens"] == tokens
    assert inference.attributes["disan.batch.size"] >= 2  # this request's rows, maybe others'
    assert inference.attributes["disan.batch.padded_tokens"] >= tokens
    assert inference.attributes["disan.batch.id"].startswith("encoder#")
    # the response's TEI-style timing headers measure the same stages
    assert float(r.headers["x-inference-time"]) == pytest.approx(
        (inference.end_time - inference.start_time) / 1e6, abs=0.01)


def test_traceparent_makes_the_request_a_child_of_the_callers_span(traced):
    client, exporter = traced
    header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    r, (server,), children = spans_of(exporter, lambda: client.post(
        "/nli", json={"pairs": [{"premise": "a man is playing", "hypothesis": "a man is sleeping"}]},
        headers=header))
    assert r.status_code == 200, r.text
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert f"{server.parent.span_id:016x}" == PARENT_ID and server.parent.is_remote
    assert {f"{s.context.trace_id:032x}" for s in children} == {TRACE_ID}
    # NLI: both sentences through the encoder, then the head: a queue and a call on each graph
    graphs = {s.attributes["disan.graph"] for s in children if s.name == "inference"}
    assert len(graphs) == 2 and "nli_head" in graphs
    assert [s.name for s in children].count("tokenize") == 2  # premises, hypotheses


def test_without_traceparent_each_request_starts_a_trace(traced):
    client, exporter = traced
    _, (first,), _ = spans_of(exporter, lambda: client.post("/embed", json={"texts": ["a dog"]}))
    _, (second,), _ = spans_of(exporter, lambda: client.post("/embed", json={"texts": ["a dog"]}))
    assert first.parent is None and second.parent is None
    assert first.context.trace_id != second.context.trace_id


def test_requests_batched_together_share_the_call_and_its_size(tiny_bundle):
    """Two requests in one onnxruntime call: each has its own queue and inference spans, and both
    inference spans name the same call and count both requests' rows."""
    exporter = in_memory()
    with TestClient(traced_app(tiny_bundle, exporter, max_wait_ms=300.0)) as c:
        wait_ready(c.get)
        exporter.clear()
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda t: c.post("/embed", json={"texts": [t]}),
                                    ["a man is playing", "the dog runs"]))
    assert [r.status_code for r in replies] == [200, 200]
    inference = [s for s in exporter.get_finished_spans() if s.name == "inference"]
    assert len(inference) == 2
    assert len({s.attributes["disan.batch.id"] for s in inference}) == 1
    assert [s.attributes["disan.batch.size"] for s in inference] == [2, 2]
    assert [s.attributes["disan.rows"] for s in inference] == [1, 1]
    assert inference[0].context.trace_id != inference[1].context.trace_id  # two requests, two traces


def test_routes_name_the_span_probes_are_not_traced_errors_keep_their_status(traced):
    client, exporter = traced
    _, (info,), children = spans_of(exporter, lambda: client.get("/info"))
    assert info.name == "GET /info" and not children
    _, (model,), _ = spans_of(exporter, lambda: client.get("/v1/models/nothing-here"))
    assert model.name == "GET /v1/models/{model}" and model.attributes["http.response.status_code"] == 404
    _, (lost,), _ = spans_of(exporter, lambda: client.get("/no/such/path"))
    assert lost.name == "GET" and "http.route" not in lost.attributes
    for probe in ("/health", "/ready", "/metrics"):
        assert spans_of(exporter, lambda p=probe: client.get(p))[1:] == ([], [])
    # refused before tokenizing: the server span alone, a 4xx is not a server error
    r, (refused,), children = spans_of(exporter, lambda: client.post("/embed", json={"texts": []}))
    assert r.status_code == 422 and not children
    assert refused.attributes["http.response.status_code"] == 422 and refused.status.is_unset


def test_a_sampled_out_request_records_nothing(tiny_bundle, monkeypatch):
    exporter = in_memory()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")  # read when the provider is built
    with TestClient(traced_app(tiny_bundle, exporter)) as c:
        wait_ready(c.get)
        assert c.post("/embed", json={"texts": ["a dog"]}).status_code == 200
    assert exporter.get_finished_spans() == ()


def test_the_service_name_and_version_are_the_resource(monkeypatch):
    exporter = in_memory()
    import disan

    assert Tracing(Settings(otlp_endpoint=ENDPOINT), exporter).provider.resource.attributes[
        "service.name"] == "disan-serve"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,team=search")
    resource = Tracing(Settings(otlp_endpoint=ENDPOINT), exporter).provider.resource.attributes
    assert resource["service.name"] == "from-attributes" and resource["team"] == "search"
    assert resource["service.version"] == disan.__version__ and resource["process.pid"] == os.getpid()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "embedder")  # the standard variable wins
    assert Tracing(Settings(otlp_endpoint=ENDPOINT), exporter).provider.resource.attributes[
        "service.name"] == "embedder"


def test_the_standard_variables_turn_tracing_on_and_place_the_endpoint(monkeypatch):
    assert Settings().otlp_endpoint is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert Settings().otlp_endpoint == "http://collector:4318/"
    assert traces_endpoint("http://collector:4318/", protocol()) == "http://collector:4318" + TRACES_PATH
    monkeypatch.setenv("DISAN_OTLP_ENDPOINT", "http://other:4318")  # ours wins, as a flag would
    assert Settings().otlp_endpoint == "http://other:4318"
    assert Settings(otlp_endpoint="http://flag:4318").otlp_endpoint == "http://flag:4318"
    monkeypatch.setenv("DISAN_OTLP_ENDPOINT", " ")  # set empty: off
    assert Settings().otlp_endpoint is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://x:1/traces")  # the exporter's own
    assert traces_endpoint("http://collector:4318", "http/protobuf") is None
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    assert traces_endpoint("http://collector:4317", "grpc") == "http://collector:4317"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="http/protobuf"):
        protocol()


class _Receiver(BaseHTTPRequestHandler):
    """A stand-in OTLP/HTTP collector: keeps each request's path and body."""

    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_spans_reach_an_otlp_http_collector_named_by_the_standard_variable(tiny_bundle, monkeypatch):
    """The real exporter: OTEL_EXPORTER_OTLP_ENDPOINT -> POST <endpoint>/v1/traces, protobuf, sent
    at the latest when the app shuts down."""
    in_memory()
    trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2",
                                        reason=REASON)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.received = []
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "disan-under-test")
        app = create_app(Settings(bundle=tiny_bundle))
        assert app.tracing is not None
        with TestClient(app) as c:
            wait_ready(c.get)
            r = c.post("/embed", json={"texts": ["a man is playing"]},
                       headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
            assert r.status_code == 200
        deadline = time.monotonic() + 10
        while not _Receiver.received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
    assert {path for path, _ in _Receiver.received} == {TRACES_PATH}
    names, services = [], set()
    for _, body in _Receiver.received:
        request = trace_service.ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes
                         if a.key == "service.name"}
            names += [(s.name, s.trace_id.hex()) for scope in resource_spans.scope_spans for s in scope.spans]
    assert services == {"disan-under-test"}
    assert sorted(names) == sorted((n, TRACE_ID) for n in ("POST /embed", "tokenize", "queue", "inference"))


def test_a_collector_that_does_not_answer_holds_the_shutdown_flush_s_at_most(tiny_bundle, monkeypatch):
    in_memory()
    with socket.socket() as probe:  # a port nothing listens on: every export is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    client = TestClient(create_app(Settings(bundle=tiny_bundle)))
    client.__enter__()
    try:
        wait_ready(client.get)
        assert client.post("/embed", json={"texts": ["a dog"]}).status_code == 200
    finally:
        t0 = time.perf_counter()
        client.__exit__(None, None, None)
    assert time.perf_counter() - t0 < FLUSH_S + 2  # the exporter alone retries for about 10 s


def block_otel_sdk(monkeypatch) -> None:
    """Make OpenTelemetry's SDK and exporters unimportable, as without the extra (the API may
    stay: FastAPI itself may depend on it)."""
    for name in [m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("opentelemetry.sdk", "opentelemetry.exporter"):
        monkeypatch.setitem(sys.modules, name, None)


def test_off_by_default_and_served_without_the_sdk(tiny_bundle, monkeypatch):
    block_otel_sdk(monkeypatch)
    app = create_app(Settings(bundle=tiny_bundle))
    assert app.tracing is None
    with TestClient(app) as c:
        wait_ready(c.get)
        r = c.post("/embed", json={"texts": ["a man is playing"]},
                   headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        assert r.status_code == 200 and "x-inference-time" in r.headers


def test_an_endpoint_without_the_extra_fails_at_start_naming_it(tiny_bundle, monkeypatch, capsys):
    block_otel_sdk(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    with pytest.raises(MissingDependency, match=r"OTEL_EXPORTER_OTLP_ENDPOINT.*pip install '\.\[tracing\]'"):
        create_app(Settings(bundle=tiny_bundle))
    from disan.cli import main

    # `disan serve` says it in one line before it starts any server
    assert main(["serve", "--bundle", str(tiny_bundle), "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "opentelemetry-sdk is not installed" in err
    assert err.endswith("`disan serve` needs: pip install '.[tracing]'"), err
