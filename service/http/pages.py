"""Pages: the offline API docs (Swagger UI, ReDoc) and the playground at /ui.

No CDN: the Swagger UI and ReDoc builds come from the fastapi-offline wheel, so the pages work on
an air-gapped host.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

DOCS_ASSETS = "/docs-assets"
# The API documentation pages: behind the API key when one is set (service.main), like the schema.
DOCS_PAGES = ("/docs", "/docs/oauth2-redirect", "/redoc")
# Swagger UI and ReDoc builds shipped inside the fastapi-offline wheel (a serve dependency).
DOCS_ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
WEB_DIR = Path(__file__).resolve().parent / "web"
pages = APIRouter(include_in_schema=False)


@pages.get("/")
async def home() -> RedirectResponse:
    """The playground."""
    return RedirectResponse("ui/")


@pages.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI from local assets (FastAPI's custom-docs recipe)."""
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}", title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
        swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
        # no spec validation badge: it would call swagger.io's online validator
        swagger_ui_parameters={**(request.app.swagger_ui_parameters or {}), "validatorUrl": None})


@pages.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@pages.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc from local assets, without Google Fonts."""
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}", title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png", with_google_fonts=False)


def install_pages(app: FastAPI) -> None:
    """Mount /docs, /redoc (with their assets) and the playground at /ui (`/` redirects there).

    The app must be created with docs_url=None and redoc_url=None (FastAPI's own pages load
    Swagger UI and ReDoc from a CDN)."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=DOCS_ASSETS_DIR), name="docs-assets")
    app.mount("/ui", StaticFiles(directory=WEB_DIR, html=True), name="ui")
    app.include_router(pages)
