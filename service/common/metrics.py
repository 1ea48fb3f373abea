"""Prometheus metrics: requests by route and status, where each inference request's time went,
queue depth, batch shapes, ORT time. The names are stable (dashboards depend on them):

| metric | type | labels | what |
| --- | --- | --- | --- |
| `disan_requests_total` | counter | route, method, status | HTTP responses |
| `disan_request_duration_seconds` | histogram | route, method | whole request, server side |
| `disan_request_tokenize_seconds` | histogram | route | tokenizing one inference request |
| `disan_request_queue_seconds` | histogram | route | submitted -> its first sentence runs |
| `disan_request_inference_seconds` | histogram | route | its first sentence runs -> last done |
| `disan_request_tokens` | histogram | route | tokens fed to the model per request |
| `disan_batch_size` | histogram | graph | sentences per onnxruntime call |
| `disan_batch_padded_cells` | histogram | graph | batch x max_len^2 per call |
| `disan_inference_seconds` | histogram | graph | onnxruntime time per call |
| `disan_sentences_total` | counter | graph | sentences run |
| `disan_queue_depth` | gauge | graph | sentences waiting (summed over live workers) |
| `disan_requests_in_progress` | gauge | | admitted inference requests (summed over live workers) |

`route` is the matched route's path (`/embed`, `/docs`), never the raw URL, so scanners hitting
random paths cannot blow up the label cardinality (they are counted as `unmatched`).

One worker: each app owns a private `CollectorRegistry` (tests build many apps in one process).
Several workers (`disan serve --workers N` sets PROMETHEUS_MULTIPROC_DIR to a fresh directory
before the workers start): prometheus_client's multiprocess mode, every worker writes its values
to files there and `/metrics` on any worker reports the sum over all of them, so counters never go
backwards between scrapes that land on different workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.common.timing import RequestTiming
from service.common.workers import process_alive

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_CELL_BUCKETS = tuple(4.0**k for k in range(2, 13))  # 16 .. 16.7M padded cells
_TOKEN_BUCKETS = tuple(2.0**k for k in range(0, 17))  # 1 .. 65536 tokens


def multiprocess_dir() -> Path | None:
    """The shared metrics directory when several workers serve (prometheus_client reads the same
    variable when it is imported, so it must be set before the worker processes start)."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def forget_dead_workers(directory: Path) -> None:
    """Drop the live-gauge files of worker processes that no longer exist (a killed worker's
    queue depth must not count forever); counters and histograms keep their totals."""
    for path in directory.glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        if not process_alive(pid):
            prometheus_multiprocess.mark_process_dead(pid, str(directory))


class Metrics:
    """The service's metric families: a private registry, or the shared multiprocess directory."""

    def __init__(self) -> None:
        shared = multiprocess_dir()
        if shared is not None:
            forget_dead_workers(shared)
            self.registry = CollectorRegistry()
            prometheus_multiprocess.MultiProcessCollector(self.registry, path=str(shared))
            r = None  # values live in the directory's files; the collector above reads them all
        else:
            self.registry = CollectorRegistry(auto_describe=True)
            r = self.registry
        self.shared = shared
        self.requests = Counter("disan_requests_total", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("disan_request_duration_seconds", "HTTP request latency",
                                 ["route", "method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokenize = Histogram("disan_request_tokenize_seconds", "tokenizing time per inference request",
                                  ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("disan_request_queue_seconds", "queue wait per inference request "
                                    "(submitted -> its first sentence runs)", ["route"],
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.request_inference = Histogram("disan_request_inference_seconds", "model time per inference "
                                           "request (its first sentence runs -> its last is done)",
                                           ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Histogram("disan_request_tokens", "tokens fed to the model per inference request",
                                ["route"], buckets=_TOKEN_BUCKETS, registry=r)
        self.queue_depth = Gauge("disan_queue_depth", "sentences waiting to be batched", ["graph"],
                                 registry=r, multiprocess_mode="livesum")
        self.in_progress = Gauge("disan_requests_in_progress", "admitted inference requests in progress",
                                 registry=r, multiprocess_mode="livesum")
        self.batch_size = Histogram("disan_batch_size", "sentences per onnxruntime call", ["graph"],
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.batch_cells = Histogram("disan_batch_padded_cells",
                                     "padded cells per onnxruntime call (batch x max_len^2)", ["graph"],
                                     buckets=_CELL_BUCKETS, registry=r)
        self.inference = Histogram("disan_inference_seconds", "onnxruntime time per batch", ["graph"],
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self.sentences = Counter("disan_sentences_total", "sentences processed", ["graph"], registry=r)
        # (route, method, status) -> the labelled request counter and latency histogram
        self._request_children: dict[tuple[str, str, int], tuple] = {}
        self._inference_children: dict[str, tuple] = {}

    def on_batch(self, graph: str, size: int, cells: int, seconds: float) -> None:
        """Batcher hook: one onnxruntime call finished (or failed)."""
        self.batch_size.labels(graph).observe(size)
        self.batch_cells.labels(graph).observe(cells)
        self.inference.labels(graph).observe(seconds)
        self.sentences.labels(graph).inc(size)

    def on_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One HTTP response sent (`route` is the path template, never the raw URL)."""
        key = (route, method, status)
        children = self._request_children.get(key)
        if children is None:  # labels() costs a lock and a dict build; the set of keys is small
            children = (self.requests.labels(route, method, str(status)), self.latency.labels(route, method))
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def on_inference(self, route: str, timing: RequestTiming) -> None:
        """Where one inference request's time went (nothing if it never reached the model)."""
        if not timing.inferred:
            return
        children = self._inference_children.get(route)
        if children is None:
            children = (self.tokenize.labels(route), self.queue_wait.labels(route),
                        self.request_inference.labels(route), self.tokens.labels(route))
            self._inference_children[route] = children
        children[0].observe(timing.tokenize_s)
        children[1].observe(timing.queue_s)
        children[2].observe(timing.inference_s)
        children[3].observe(timing.tokens)

    def on_depth(self, graph: str, depth: int) -> None:
        """Batcher hook: queue depth changed."""
        self.queue_depth.labels(graph).set(depth)

    def on_admission(self, in_progress: int) -> None:
        """Admission hook: admitted inference requests in progress."""
        self.in_progress.set(in_progress)

    def close(self) -> None:
        """This worker is leaving: its live gauges stop counting (its totals stay)."""
        if self.shared is not None:
            prometheus_multiprocess.mark_process_dead(os.getpid(), str(self.shared))

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RouteLabels:
    """`route` label of a request: the path of the route that matched it (FastAPI's routes set
    scope["route"]; /docs, /openapi.json and mounts do not, so they are matched here)."""

    def __init__(self, routes: Sequence[Any]):
        self.routes = routes  # the app's live route list (routes added later are seen)

    def __call__(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is not None:
            return route.path
        for candidate in self.routes:
            match, _ = candidate.matches(scope)
            if match is not Match.NONE:
                return getattr(candidate, "path", "unmatched") or "/"
        return "unmatched"


class MetricsMiddleware:
    """Pure ASGI middleware: counts every HTTP response by route, method and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics, route_of: Callable[[Scope], str]):
        self.app = app
        self.metrics = metrics
        self.route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.on_request(self.route_of(scope), scope.get("method", ""), status["code"],
                                    time.perf_counter() - t0)
