"""FastAPI's exception handlers: every failure answered from the one error table
(`service.common.errors.ERROR_TABLE`), with the stable body and the row's status code."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.common.errors import ERROR_TABLE, ServiceError, error_body, public_message, validation_message

log = logging.getLogger("disan.service")
_BY_STATUS = {status: etype for etype, (status, _) in ERROR_TABLE.items()}


def error_response(etype: str, message: str, headers: dict[str, str] | None = None,
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    """A JSONResponse for one row of the table."""
    return JSONResponse(error_body(etype, message, param, code), status_code=ERROR_TABLE[etype][0],
                        headers=headers)


async def _on_service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return error_response(exc.type, public_message(exc, request.url.path), exc.headers, exc.param, exc.code)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    etype, message = validation_message(exc.errors())
    return error_response(etype, message)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    etype = _BY_STATUS.get(exc.status_code)
    if etype is None:  # a status outside the table: keep the code, still use the stable body
        return JSONResponse(error_body("http_error", str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))
    return error_response(etype, str(exc.detail), getattr(exc, "headers", None))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response("internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through the table (service.common.errors)."""
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
