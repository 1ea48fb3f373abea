"""Prometheus metrics: request counts/latency by route and status, queue depth, batch shapes, ORT time.

Each app owns its own `CollectorRegistry` (tests build many apps in one process). With several
uvicorn workers every process reports its own numbers; scrape them per replica.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_CELL_BUCKETS = tuple(4.0**k for k in range(2, 13))  # 16 .. 16.7M padded cells


class Metrics:
    """The service's metric families on a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("disan_requests_total", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("disan_request_duration_seconds", "HTTP request latency",
                                 ["route", "method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("disan_queue_depth", "sentences waiting to be batched", ["graph"],
                                 registry=r)
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

    def on_depth(self, graph: str, depth: int) -> None:
        """Batcher hook: queue depth changed."""
        self.queue_depth.labels(graph).set(depth)

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Pure ASGI middleware: counts every HTTP response by route template, method and status.

    The route label is the matched path template (`/embed`), never the raw URL, so scanners
    hitting random paths cannot blow up the label cardinality.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

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
            label = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.on_request(label, scope.get("method", ""), status["code"], time.perf_counter() - t0)
