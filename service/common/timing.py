"""Where one inference request's time went: tokenizing, waiting in the queue, running the model.

The front end (fast path or FastAPI's gate middleware) puts a fresh `RequestTiming` in the
`CURRENT` context variable; the engine and the batcher add to it without knowing about HTTP; the
front end then reports it as histograms (service.common.metrics) and as TEI-style response headers.
A context variable reaches the handler because each request runs in one task (both front ends
await the handler directly; threads started with asyncio.to_thread copy the context).

While a request is traced (service.http.tracing, OpenTelemetry), `stages` is a list and the engine
and the batcher append one `Stage` per tokenizing, queueing and model call to it, which become
the request span's children; otherwise it is None and they record nothing (one `is None` test).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple


class Stage(NamedTuple):
    """One step of a traced request: `time.perf_counter()` start and end, span attributes."""

    name: str  # "tokenize", "queue", "inference"
    start: float
    end: float
    attributes: dict[str, Any]


@dataclass
class RequestTiming:
    """Seconds spent per stage (summed over the graphs a request used) and tokens fed."""

    tokenize_s: float = 0.0
    queue_s: float = 0.0  # submitted -> its first sentence started running
    inference_s: float = 0.0  # its first sentence started -> its last one finished
    tokens: int = 0
    inferred: bool = False  # the request reached the model (else there is nothing to report)
    stages: list[Stage] | None = None  # a list only while the request is traced

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Raw ASGI headers: milliseconds, like text-embeddings-inference's."""
        if not self.inferred:
            return []
        return [(b"x-tokenization-time", _ms(self.tokenize_s)), (b"x-queue-time", _ms(self.queue_s)),
                (b"x-inference-time", _ms(self.inference_s))]


def _ms(seconds: float) -> bytes:
    return f"{seconds * 1000:.3f}".encode()


CURRENT: ContextVar[RequestTiming | None] = ContextVar("disan_request_timing", default=None)
