"""The service's error types and the ONE table mapping them to HTTP status codes (FastAPI-free).

Every error response has the stable body ``{"error": {"type": ..., "message": ...}}``, except that
a request in text-embeddings-inference's shape gets TEI's ``{"error": ..., "error_type": ...}``
(`tei_error_body`), with the same status code.
500s log the details server-side and return a generic message (never a traceback or input echo).
FastAPI's exception handlers that answer with this table live in `service.http.errors`; the
engine, the batcher and the fast path use the types without importing FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("disan.service")

# type -> (HTTP status, when it happens). The single source of truth; documented in OpenAPI too.
ERROR_TABLE: dict[str, tuple[int, str]] = {
    "malformed_json": (400, "the body is not valid JSON, or nests deeper than the JSON depth limit"),
    "unauthorized": (401, "missing or wrong API key (Authorization: Bearer <key>)"),
    "not_found": (404, "no such route; on /v1, a `model` not served here (code model_not_found)"),
    "method_not_allowed": (405, "the route does not accept this method"),
    "request_timeout": (408, "the request's body did not arrive within the read timeout"),
    "request_too_large": (413, "too many texts, a text over max_chars_per_text or max_tokens_per_text, "
                               "a request over max_tokens_per_request, too many JSON values, too many "
                               "explain texts or tokens, or a body too big"),
    "invalid_request": (422, "empty list or text, wrong field type, token-id input, a text over "
                        "max_tokens with long_text=error, or `dimensions` not a size the model serves"),
    "overloaded": (429, "too many requests in progress or the batching queue is full; retry after "
                        "Retry-After seconds"),
    "headers_too_large": (431, "the request line and headers exceed max_header_bytes"),
    "no_lexical_table": (424, "POST /embed_sparse, or a `hybrid` score, on a bundle without a lexical "
                              "table (TEI answers 424 when its model is not a sparse one)"),
    "client_closed_request": (499, "the client went away before the answer was ready"),
    "internal_error": (500, "inference failed; details are in the server log"),
    "not_ready": (503, "the model is still loading / warming up, or the server is shutting down"),
}
NOT_JSON_MESSAGE = "request body must be JSON sent with Content-Type: application/json"


class ServiceError(Exception):
    """Base of every error the API reports; `type` selects the row of ERROR_TABLE."""

    type = "internal_error"
    # OpenAI's two other error fields, sent when set (its clients read them): the request field
    # at fault and a machine-readable code.
    param: str | None = None
    code: str | None = None

    def __init__(self, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return ERROR_TABLE[self.type][0]


class MalformedJSON(ServiceError):
    type = "malformed_json"


class Unauthorized(ServiceError):
    type = "unauthorized"

    def __init__(self, message: str = "missing or invalid API key"):
        super().__init__(message, {"WWW-Authenticate": "Bearer"})


class RequestTooLarge(ServiceError):
    type = "request_too_large"


class RequestTimeout(ServiceError):
    type = "request_timeout"

    def __init__(self, message: str):
        super().__init__(message, {"Connection": "close"})


class InvalidRequest(ServiceError):
    type = "invalid_request"


class NoLexicalTable(ServiceError):
    type = "no_lexical_table"


class Overloaded(ServiceError):
    type = "overloaded"

    def __init__(self, message: str = "server busy: the batching queue is full", retry_after: int = 1):
        super().__init__(message, {"Retry-After": str(retry_after)})


class ModelNotFound(ServiceError):
    """A /v1 request named a model this server does not serve (OpenAI's 404 `model_not_found`)."""

    type = "not_found"
    param = "model"
    code = "model_not_found"


class ClientClosed(ServiceError):
    type = "client_closed_request"


class NotReady(ServiceError):
    type = "not_ready"

    def __init__(self, message: str = "model not ready", retry_after: int = 1):
        super().__init__(message, {"Retry-After": str(retry_after)})


class InferenceError(ServiceError):
    """Inference failed; the message is for the log only, clients get a generic one."""

    type = "internal_error"


def error_body(etype: str, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The stable error JSON body; with a `code`, OpenAI's full shape (`param` and `code` added)."""
    if code is None:
        return {"error": {"type": etype, "message": message}}
    return {"error": {"type": etype, "message": message, "param": param, "code": code}}


# TEI's `error_type` (its ErrorType enum: Unhealthy, Backend, Overloaded, Validation, Tokenizer,
# Empty) for the types of the table; every other type (a bad body, a limit, the API key) is TEI's
# Validation. The status code stays the table's.
TEI_ERROR_TYPES: dict[str, str] = {"overloaded": "Overloaded", "not_ready": "Unhealthy",
                                   "internal_error": "Backend", "client_closed_request": "Backend",
                                   "no_lexical_table": "Backend"}


def tei_error_body(etype: str, message: str) -> dict[str, Any]:
    """text-embeddings-inference's error body, `{"error", "error_type"}`, for TEI-shaped requests."""
    return {"error": message, "error_type": TEI_ERROR_TYPES.get(etype, "Validation")}


def family_error_body(tei: bool, etype: str, message: str, param: str | None = None,
                      code: str | None = None) -> dict[str, Any]:
    """The error body of a request's family: TEI's for TEI-shaped requests, ours otherwise."""
    return tei_error_body(etype, message) if tei else error_body(etype, message, param, code)


# Type tags pydantic puts in an error's location for a union member ("input.constrained-str.0"):
# not fields, so they are left out of the location a client reads.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def format_loc(loc: Sequence[Any]) -> str:
    """A field location in the API's one notation: ``texts[0]``, ``pairs[3].premise``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "body" and not out:
            continue  # FastAPI's prefix for the request body
        elif not str(part).isidentifier() or part in _TYPE_TAGS:
            continue  # a union member's type tag, not a field
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def validation_message(errors: Sequence[Any]) -> tuple[str, str]:
    """(type, one-line message) for a body that failed parsing or validation (pydantic errors)."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return "malformed_json", "request body is not valid JSON"
    if any(format_loc(e.get("loc", ())) == "body" and isinstance(e.get("input"), bytes) for e in errors):
        # FastAPI hands over raw bytes when the Content-Type is not JSON (e.g. curl -d's form type).
        return "malformed_json", NOT_JSON_MESSAGE
    for e in errors:
        if e.get("type") == "input_items":  # the message already names every offending item
            return "invalid_request", str(e.get("msg"))
    if not errors:
        return "invalid_request", "body: invalid request"
    # Every offending item is named, those with the same problem together:
    # "texts[2], texts[7]: String should have at least 1 character; texts[9]: ..."
    by_message: dict[str, list[str]] = {}
    for e in errors:
        by_message.setdefault(str(e.get("msg", "invalid")), []).append(format_loc(e.get("loc", ())))
    return "invalid_request", "; ".join(f"{', '.join(dict.fromkeys(locs))}: {msg}"
                                        for msg, locs in by_message.items())


def public_message(exc: ServiceError, path: str) -> str:
    """What the client is told about `exc`; inference failures are logged and reported generically."""
    if exc.status >= 500 and exc.type == "internal_error":
        log.error("inference failed on %s: %s", path, exc.message)
        return "inference failed"
    return exc.message
