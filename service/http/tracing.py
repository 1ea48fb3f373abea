"""OpenTelemetry traces of the requests: optional (the `tracing` extra), off unless an endpoint is set.

`otlp_endpoint` (DISAN_OTLP_ENDPOINT, the standard OTEL_EXPORTER_OTLP_ENDPOINT or `disan serve
--otlp-endpoint`, as text-embeddings-inference's `--otlp-endpoint`) turns it on: `Tracing` then
wraps the whole app (service.main.DisanApp, ahead of the fast path and of FastAPI's stack). Each
HTTP request but the probes and the scrapes (`UNTRACED`) gets one SERVER span named
`METHOD route` with the HTTP semantic conventions' attributes, the child of the caller's span when
the request carries a W3C `traceparent` (the propagators of OTEL_PROPAGATORS: by default
tracecontext and baggage). While it runs, the engine and the batcher append the request's stages
to its `RequestTiming.stages` (service.common.timing), measured where they happen; when it ends
they become the span's children, with those times:

- `tokenize`: one per list of texts tokenized; `disan.texts`, `disan.rows` (windows included),
  `disan.tokens`;
- `queue`: one per submission to a graph's micro-batcher, from enqueueing until the first call
  holding its rows starts; `disan.graph`, `disan.rows`;
- `inference`: one per onnxruntime call that ran some of the request's rows; `disan.graph`,
  `disan.batch.id` (`graph#n`, numbered per worker process, the resource's `process.pid`: the
  spans of requests batched together carry the same id), `disan.batch.size` (the call's rows,
  all requests'), `disan.batch.padded_tokens` (size x its longest row), and the request's own
  `disan.rows` and `disan.tokens` (the batcher's row lengths: tokens, 1 per pair on the NLI head).

The server span also carries `disan.tokens` (the request's, after tokenizing). A request refused
before a stage (401, 413, 429, ...) has its server span alone, with the status. Spans go out in
batches from a background thread (the SDK's BatchSpanProcessor: OTEL_BSP_* variables) over
OTLP/HTTP (protobuf; OTEL_EXPORTER_OTLP_* variables: headers, timeout, certificates, a
traces-only endpoint), or over gRPC with OTEL_EXPORTER_OTLP_PROTOCOL=grpc and that exporter
installed; sampling is OTEL_TRACES_SAMPLER's (default: parent-based, always on), and a request
whose span is not sampled records no stages.

Off, nothing of this runs and the service imports nothing of OpenTelemetry (FastAPI may import
its API for itself): the hot path pays one `is None` test per stage. OpenTelemetry is imported in
this module only, when a `Tracing` is built. The tracer provider is this app's own, never the
global one, so libraries that trace through the global API (FastAPI's own telemetry) stay silent.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from types import ModuleType
from typing import Any

from starlette.types import Message, Receive, Scope, Send

import disan
from disan.optional import MissingDependency
from service.common.timing import CURRENT, RequestTiming
from service.settings import Settings

EXTRA = "tracing"
# Probes and scrapes: several a minute per replica, and nothing in them to trace.
UNTRACED = frozenset({"/health", "/ready", "/metrics"})
TRACES_PATH = "/v1/traces"  # added to the base endpoint, as the standard variable specifies
UNMATCHED = "unmatched"  # service.common.metrics.RouteLabels' label of a path no route has
# At shutdown, how long the spans still buffered may take to go out: a collector that does not
# answer would otherwise hold the worker's exit for the exporter's retries (about 10 s).
FLUSH_S = 2.0
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# module -> the distribution that installs it (the one a MissingDependency names)
_MODULES = {
    "opentelemetry.trace": "opentelemetry-api",
    "opentelemetry.propagate": "opentelemetry-api",
    "opentelemetry.sdk.trace": "opentelemetry-sdk",
    "opentelemetry.sdk.trace.export": "opentelemetry-sdk",
    "opentelemetry.sdk.resources": "opentelemetry-sdk",
}
_HTTP_EXPORTER = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                  "opentelemetry-exporter-otlp-proto-http")
_GRPC_EXPORTER = ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                  "opentelemetry-exporter-otlp-proto-grpc")
_WHY = " (an OTLP endpoint is set: DISAN_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, so tracing is on)"


def _import(module: str, dist: str, extra: str | None = EXTRA) -> ModuleType:
    """`module`, or MissingDependency naming `dist` and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:  # it, or a package it needs (an ImportError inside is a bug: raised)
        raise MissingDependency(dist, extra, _WHY) from None


def protocol() -> str:
    """The OTLP transport the standard variables ask for (http/protobuf unless told grpc)."""
    chosen = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
              or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if chosen not in ("http/protobuf", "grpc"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={chosen}: traces go out over http/protobuf "
                         "(the tracing extra) or grpc (with opentelemetry-exporter-otlp-proto-grpc)")
    return chosen


def require_sdk() -> dict[str, ModuleType]:
    """OpenTelemetry's API, SDK and the OTLP exporter for `protocol()`, or MissingDependency
    naming the `tracing` extra (`disan serve` checks this before it starts the server)."""
    found = {module: _import(module, dist) for module, dist in _MODULES.items()}
    module, dist = _GRPC_EXPORTER if protocol() == "grpc" else _HTTP_EXPORTER
    # the gRPC exporter (grpcio) is not in the extra: the http one is the light default
    found["exporter"] = _import(module, dist, EXTRA if module == _HTTP_EXPORTER[0] else None)
    return found


def traces_endpoint(base: str, chosen: str) -> str | None:
    """What to hand the exporter: None where OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the
    exporter reads it, as is), else `base` plus /v1/traces over HTTP, `base` itself over gRPC."""
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return None
    if chosen == "grpc":
        return base
    return base.rstrip("/") + TRACES_PATH


class Tracing:
    """The app's tracer: `await tracing(scope, receive, send, app)` serves one ASGI call traced.

    `exporter` (tests: the SDK's InMemorySpanExporter) replaces the OTLP one and gets each span as
    it ends. A request's route is the path itself for `paths` (the fast path's, which it serves
    without FastAPI's routing), else the route FastAPI matched, else `route_of(scope)`
    (service.common.metrics.RouteLabels: mounts, paths no route has)."""

    def __init__(self, settings: Settings, exporter: Any = None,
                 route_of: Callable[[Scope], str] | None = None, paths: Collection[str] = ()):
        otel = require_sdk()
        trace, sdk, export = (otel["opentelemetry.trace"], otel["opentelemetry.sdk.trace"],
                              otel["opentelemetry.sdk.trace.export"])
        self._trace = trace
        self._propagate = otel["opentelemetry.propagate"]
        self._server = trace.SpanKind.SERVER
        self._error = trace.Status(trace.StatusCode.ERROR)
        resources = otel["opentelemetry.sdk.resources"]
        # process.pid: each worker process exports its own spans (and numbers its own batches)
        self.provider = sdk.TracerProvider(resource=resources.Resource.create(
            {"service.name": self._service_name(settings, resources), "service.version": disan.__version__,
             "process.pid": os.getpid()}))
        if exporter is None:
            chosen = protocol()
            exporter = otel["exporter"].OTLPSpanExporter(
                endpoint=traces_endpoint(settings.otlp_endpoint or "", chosen))
            processor = export.BatchSpanProcessor(exporter)
        else:
            processor = export.SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("disan-serve", disan.__version__)
        self.route_of = route_of or (lambda scope: UNMATCHED)
        self.paths = frozenset(paths)

    @staticmethod
    def _service_name(settings: Settings, resources: ModuleType) -> str:
        """The setting (or OTEL_SERVICE_NAME); left at its default, a service.name given in
        OTEL_RESOURCE_ATTRIBUTES wins over it."""
        if "otlp_service_name" not in settings.model_fields_set:
            given = str(resources.Resource.create().attributes.get("service.name", ""))
            if given and not given.startswith("unknown_service"):
                return given
        return settings.otlp_service_name

    def shutdown(self, timeout_s: float = FLUSH_S) -> None:
        """Export what is left and stop the exporter (the app's shutdown), waiting `timeout_s`
        at most: what has not gone out by then is dropped with the (daemon) thread sending it."""
        flush = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        flush.start()
        flush.join(timeout_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        span = self.tracer.start_span(scope["method"], context=self._propagate.extract(headers),
                                      kind=self._server, attributes=request_attributes(scope, headers))
        if not span.is_recording():  # sampled out: serve it as if tracing were off
            span.end()
            await app(scope, receive, send)
            return
        timing = RequestTiming(stages=[])  # the front ends add to it (service.http.fastpath, asgi)
        token = CURRENT.set(timing)
        wall0, perf0 = time.time_ns(), time.perf_counter()
        status = 0

        async def send_traced(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            with self._trace.use_span(span, end_on_exit=False):
                await app(scope, receive, send_traced)
        finally:
            CURRENT.reset(token)
            self._finish(span, scope, status, timing, wall0, perf0)

    def route(self, scope: Scope) -> str:
        """The route template that served `scope` (`/v1/models/{model}`), or UNMATCHED."""
        if scope["path"] in self.paths:
            return scope["path"]
        matched = scope.get("route")  # set by FastAPI's router on the scope it was handed
        return matched.path if matched is not None else self.route_of(scope)

    def _finish(self, span: Any, scope: Scope, status: int, timing: RequestTiming, wall0: int,
                perf0: float) -> None:
        """Name the span by its route, set the response's attributes, add the stages as children
        (perf_counter times -> the epoch nanoseconds of OpenTelemetry), end it."""
        route = self.route(scope)
        if route != UNMATCHED:
            span.update_name(f"{scope['method']} {route}")
            span.set_attribute("http.route", route)
        if status:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_attribute("error.type", str(status))
                span.set_status(self._error)
        if timing.tokens:
            span.set_attribute("disan.tokens", timing.tokens)
        parent = self._trace.set_span_in_context(span)

        def ns(t: float) -> int:
            return wall0 + int((t - perf0) * 1e9)

        for stage in timing.stages or ():
            child = self.tracer.start_span(stage.name, context=parent, start_time=ns(stage.start),
                                           attributes=stage.attributes)
            child.end(end_time=ns(stage.end))
        span.end()


def request_attributes(scope: Scope, headers: dict[str, str]) -> dict[str, Any]:
    """The HTTP server span's attributes known before the answer (OpenTelemetry's semantic
    conventions for HTTP)."""
    attributes: dict[str, Any] = {"http.request.method": scope["method"], "url.path": scope["path"],
                                  "url.scheme": scope.get("scheme", "http"),
                                  "network.protocol.version": scope.get("http_version", "1.1")}
    server, client = scope.get("server"), scope.get("client")
    if server:
        attributes["server.address"] = server[0]
        if server[1] is not None:
            attributes["server.port"] = server[1]
    if client:
        attributes["client.address"] = client[0]
    if "user-agent" in headers:
        attributes["user_agent.original"] = headers["user-agent"]
    if headers.get("content-length", "").isdigit():
        attributes["http.request.body.size"] = int(headers["content-length"])
    return attributes


def from_settings(settings: Settings, route_of: Callable[[Scope], str] | None = None,
                  paths: Collection[str] = ()) -> Tracing | None:
    """The app's `Tracing` when an OTLP endpoint is set, else None (and nothing imported)."""
    if settings.otlp_endpoint is None:
        return None
    return Tracing(settings, route_of=route_of, paths=paths)
