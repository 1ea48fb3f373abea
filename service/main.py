"""App factory: `create_app(settings)` wires settings, runtime, batchers, routes, errors and metrics.

Lifespan: start loading + warm-up in the background (so /health answers at once and /ready is
503 until warm), and on shutdown stop accepting work and drain the batchers. uvicorn handles
SIGTERM by closing the listener and waiting for in-flight requests before running the shutdown.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import disan
from service.errors import error_body, install_error_handlers
from service.fastpath import InferenceFastPath
from service.metrics import Metrics, MetricsMiddleware
from service.pipeline import Service
from service.routes import AUTH, inference, router
from service.settings import Settings

log = logging.getLogger("disan.service")

DESCRIPTION = """DiSAN sentence embeddings, NLI and sentiment over onnxruntime with dynamic
micro-batching. Errors always have the body `{"error": {"type", "message"}}`."""


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes with 413 before any JSON parsing.

    A declared Content-Length over the limit is refused without reading; otherwise the body is
    read chunk by chunk (chunked uploads have no Content-Length) and refused as soon as it
    exceeds the limit, then replayed to the app.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def _refuse(self, send: Send, message: str) -> None:
        body = json.dumps(error_body("request_too_large", message)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_big = f"request body over {self.limit} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await self._refuse(send, too_big)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send, too_big)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app for `settings` (default: from the environment)."""
    settings = settings or Settings()
    metrics = Metrics()
    service = Service(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="disan-serve", version=disan.__version__, description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.settings = settings
    app.state.service = service
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(inference, **(AUTH if settings.api_key is not None else {}))
    # Added innermost first: the fast path sees bodies the limit let through, CORS applies to
    # everything, metrics count everything.
    if settings.fast_path:
        app.add_middleware(InferenceFastPath, service=service)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_bytes)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def create_app_from_env() -> FastAPI:
    """uvicorn factory used by `disan serve` (settings come from DISAN_* variables)."""
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return create_app(settings)
