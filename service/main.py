"""App factory: `create_app(settings)` wires settings, runtime, batchers, routes, errors and metrics.

Lifespan: start loading + warm-up in the background (so /health answers at once and /ready is
503 until warm), hand the HTTP protocol its limits and the drain signal (service.http.protocol), and on
shutdown stop accepting work and drain the batchers. uvicorn handles SIGTERM by closing the
listener and waiting for in-flight requests (until the drain deadline, service.inference.engine) before
running the shutdown.

Open without the API key: /health, /ready and /metrics (probes and scrapers carry no key). With a
key set, everything else needs it, the API documentation (/docs, /redoc, /openapi.json) included.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

import disan
from disan.bundle.dimensions import any_size_up_to, every_size, sizes_text
from disan.bundle.manifest import matryoshka_dims
from service.common.errors import Unauthorized
from service.common.metrics import Metrics, MetricsMiddleware, RouteLabels
from service.http.asgi import BodyPolicy, GateMiddleware, send_error
from service.http.endpoints import HANDLERS
from service.http.errors import install_error_handlers
from service.http.fastpath import InferenceFastPath, bearer_credentials, header_value
from service.http.handlers import api_key_ok
from service.http.pages import DOCS_PAGES, install_pages
from service.http.protocol import HOOKS_KEY, HttpHooks
from service.http.routes import AUTH, inference, router
from service.http.tracing import Tracing
from service.http.tracing import from_settings as tracing_from_settings
from service.inference.admission import Admission
from service.inference.engine import Engine
from service.settings import Settings

log = logging.getLogger("disan.service")
# uvicorn's STARTUP_FAILURE: with several workers, its supervisor (uvicorn >= 0.50) stops on it.
LOAD_FAILURE_STATUS = 3

DESCRIPTION = """DiSAN sentence embeddings, NLI and sentiment over onnxruntime with dynamic
micro-batching, with OpenAI's, text-embeddings-inference's (TEI) and Cohere/Jina's rerank API beside
its own. Errors have the body `{"error": {"type", "message"}}`; a TEI-shaped request's have TEI's
`{"error", "error_type"}`."""


class DisanApp(FastAPI):
    """FastAPI with the inference fast path in front of its middleware stack, the API docs behind
    the API key when one is set, and an OpenAPI schema that states the served model's dim."""

    fast_path: InferenceFastPath | None = None
    engine: Engine | None = None
    tracing: Tracing | None = None  # with an OTLP endpoint set (service.http.tracing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.tracing is not None:
            await self.tracing(scope, receive, send, self.serve)
            return
        await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One ASGI call: the fast path's, the docs' key check, or FastAPI's stack."""
        if self.fast_path is not None and self.fast_path.claims(scope):
            await self.fast_path(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] in self.docs_paths and not self._key_ok(scope):
            await send_error(send, Unauthorized())
            return
        await super().__call__(scope, receive, send)

    @property
    def docs_paths(self) -> frozenset[str]:
        return frozenset((self.openapi_url, *DOCS_PAGES) if self.openapi_url else DOCS_PAGES)

    def _key_ok(self, scope: Scope) -> bool:
        assert self.engine is not None
        return api_key_ok(self.engine, bearer_credentials(header_value(scope, b"authorization")))

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        runtime = self.engine.runtime if self.engine is not None else None
        if runtime is None:  # the dim is known once the bundle is loaded: do not cache before
            self.openapi_schema = None
            return schema
        patched = copy.deepcopy(schema)
        sizes = matryoshka_dims(runtime.manifest, runtime.dim)
        up_to = any_size_up_to(runtime.manifest)
        served = [{"type": "integer", "enum": sizes}]
        if every_size(sizes, up_to):
            served = [{"type": "integer", "minimum": 1, "maximum": sizes[0]}]
        elif up_to:
            served = [{"type": "integer", "enum": sizes[:1]},
                      {"type": "integer", "minimum": 1, "maximum": up_to}]
        for model in patched.get("components", {}).get("schemas", {}).values():
            dims = model.get("properties", {}).get("dimensions")
            if dims is not None:
                dims.clear()
                dims.update({"anyOf": [*served, {"type": "null"}],
                             "title": "Dimensions",
                             "description": f"{sizes_text(sizes, up_to)}, the sizes this model serves: each "
                                            "vector cut to `dimensions` components (its first ones, "
                                            "or its coordinates on the bundle's principal axes), "
                                            f"then normalised where asked; omitted: {runtime.dim}"})
        self.openapi_schema = patched
        return patched


def create_app(settings: Settings | None = None) -> DisanApp:
    """Build the ASGI app for `settings` (default: from the environment)."""
    settings = settings or Settings()
    metrics = Metrics()
    engine = Engine(settings, metrics)
    admission = Admission(settings.max_concurrent_requests, settings.admission_wait_s,
                          settings.max_queue_wait_s, engine.queued_seconds, on_change=metrics.on_admission)
    policy = BodyPolicy(settings.max_request_bytes, settings.body_timeout_s, settings.max_json_items)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        await engine.start()
        try:
            yield {HOOKS_KEY: HttpHooks(max_header_bytes=settings.max_header_bytes,
                                        header_timeout_s=settings.header_timeout_s,
                                        begin_drain=engine.begin_drain)}
        finally:
            await engine.stop()
            if app.tracing is not None:  # the spans still buffered go out (bounded by the exporter)
                await asyncio.to_thread(app.tracing.shutdown)

    # docs_url/redoc_url None: FastAPI's pages load from a CDN; install_pages serves local copies.
    app = DisanApp(title="disan-serve", version=disan.__version__, description=DESCRIPTION,
                   lifespan=lifespan, docs_url=None, redoc_url=None)
    app.engine = engine
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.admission = admission
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(inference, **(AUTH if settings.api_key is not None else {}))
    install_pages(app)
    # Added innermost first: CORS applies to everything, metrics count everything. The fast path
    # does the gate (admission, body policy) and the metrics itself, and leaves requests with a
    # CORS Origin to CORS.
    if settings.fast_path:
        app.fast_path = InferenceFastPath(engine, metrics, policy, admission,
                                          cors=bool(settings.cors_origins))
    app.add_middleware(GateMiddleware, policy=policy, admission=admission,
                       inference_paths=tuple(HANDLERS), metrics=metrics)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(MetricsMiddleware, metrics=metrics, route_of=RouteLabels(app.router.routes))
    # Off unless an OTLP endpoint is set; then MissingDependency names the extra if it is missing.
    app.tracing = tracing_from_settings(settings, RouteLabels(app.router.routes), paths=HANDLERS)
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
