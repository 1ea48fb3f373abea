"""App factory: `create_app(settings)` wires settings, runtime, batchers, routes, errors and metrics.

Lifespan: start loading + warm-up in the background (so /health answers at once and /ready is
503 until warm), and on shutdown stop accepting work and drain the batchers. uvicorn handles
SIGTERM by closing the listener and waiting for in-flight requests before running the shutdown.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

import disan
from service.asgi import BodyLimitMiddleware
from service.engine import Engine
from service.errors import install_error_handlers
from service.fastpath import InferenceFastPath
from service.metrics import Metrics, MetricsMiddleware
from service.routes import AUTH, inference, install_pages, router
from service.settings import Settings

log = logging.getLogger("disan.service")
# uvicorn's STARTUP_FAILURE: with several workers, its supervisor (uvicorn >= 0.50) stops on it.
LOAD_FAILURE_STATUS = 3

DESCRIPTION = """DiSAN sentence embeddings, NLI and sentiment over onnxruntime with dynamic
micro-batching. Errors always have the body `{"error": {"type", "message"}}`."""


class DisanApp(FastAPI):
    """FastAPI with the inference fast path in front of its middleware stack."""

    fast_path: InferenceFastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fast_path is not None and self.fast_path.claims(scope):
            await self.fast_path(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> DisanApp:
    """Build the ASGI app for `settings` (default: from the environment)."""
    settings = settings or Settings()
    metrics = Metrics()
    engine = Engine(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    # docs_url/redoc_url None: FastAPI's pages load from a CDN; install_pages serves local copies.
    app = DisanApp(title="disan-serve", version=disan.__version__, description=DESCRIPTION,
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(inference, **(AUTH if settings.api_key is not None else {}))
    install_pages(app)
    # Added innermost first: CORS applies to everything, metrics count everything. The fast path
    # does the body limit and the metrics itself, and leaves requests with a CORS Origin to CORS.
    if settings.fast_path:
        app.fast_path = InferenceFastPath(engine, metrics, settings.max_request_bytes,
                                          cors=bool(settings.cors_origins))
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_bytes)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def exit_unloadable(detail: str) -> None:
    """End a `disan serve` process whose bundle cannot load (the reason is already logged).

    Loading fails the same way on every retry (bad files, `providers=cuda` where CUDA does not
    load), and a server that stays up unready forever looks alive to `docker compose up`. The
    status is uvicorn's start-up failure code, on which its worker supervisor stops as well.
    """
    logging.shutdown()  # flush the log line that says why
    os._exit(LOAD_FAILURE_STATUS)


def create_app_from_env() -> DisanApp:
    """uvicorn factory used by `disan serve` (settings come from DISAN_* variables)."""
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    app.state.engine.on_load_failure = exit_unloadable
    return app
