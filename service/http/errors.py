"""FastAPI's exception handlers: every failure answered from the one error table
(`service.common.errors.ERROR_TABLE`), with the stable body and the row's status code; a
TEI-shaped request gets TEI's body (`service.http.tei_schemas.is_tei`: its route, its body's keys,
or the mark its route left in the scope, `TEI_SCOPE_KEY`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.common.errors import (
    ERROR_TABLE,
    ServiceError,
    family_error_body,
    public_message,
    validation_message,
)
from service.http.tei_schemas import is_tei

log = logging.getLogger("disan.service")
_BY_STATUS = {status: etype for etype, (status, _) in ERROR_TABLE.items()}
# Set in the ASGI scope by a route that parsed a TEI-shaped body (service.http.routes).
TEI_SCOPE_KEY = "disan.tei"


def error_response(etype: str, message: str, headers: dict[str, str] | None = None,
                   param: str | None = None, code: str | None = None, tei: bool = False) -> JSONResponse:
    """A JSONResponse for one row of the table (TEI's body where `tei`)."""
    return JSONResponse(family_error_body(tei, etype, message, param, code),
                        status_code=ERROR_TABLE[etype][0], headers=headers)


def _tei(request: Request, body: object = None) -> bool:
    return bool(request.scope.get(TEI_SCOPE_KEY)) or is_tei(request.url.path, body)


async def _on_service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return error_response(exc.type, public_message(exc, request.url.path), exc.headers, exc.param, exc.code,
                          _tei(request))


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    etype, message = validation_message(exc.errors())
    return error_response(etype, message, tei=_tei(request, exc.body))


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    etype = _BY_STATUS.get(exc.status_code)
    if etype is None:  # a status outside the table: keep the code, still use the stable body
        return JSONResponse(family_error_body(_tei(request), "http_error", str(exc.detail)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))
    return error_response(etype, str(exc.detail), getattr(exc, "headers", None), tei=_tei(request))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response("internal_error", "internal server error", tei=_tei(request))


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through the table (service.common.errors)."""
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
