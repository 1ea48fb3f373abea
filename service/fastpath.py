"""Fast path for the inference routes: FastAPI's handlers and contract, without its per-request cost.

With one sentence per request, FastAPI's routing, dependency solving and body parsing cost more
CPU than the model: measured with inference stubbed out, a POST /embed took 0.9 ms of server
CPU through FastAPI and 0.5 ms through this path (bench/RESULTS.md, "per-request overhead").

`InferenceFastPath` is a pure ASGI middleware installed innermost, so CORS, the body-size limit
and the metrics still wrap it. It answers only POST on the paths of `routes.HANDLERS`, with the
same request models and parsing (stdlib json, then strict pydantic), the same handlers, the same
API-key check and the same error table as the FastAPI routes; everything else, the OpenAPI schema
included, is FastAPI's. tests/test_fastpath.py checks both give identical answers; one
deliberate difference: the API key is checked before the body is read (FastAPI decodes the JSON
first, so a keyless malformed body gets 400 there and 401 here). `Settings.fast_path=false`
turns the fast path off, and the API tests run against both.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import orjson
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import (
    ERROR_TABLE,
    NOT_JSON_MESSAGE,
    InvalidRequest,
    MalformedJSON,
    ServiceError,
    Unauthorized,
    error_body,
    public_message,
    validation_message,
)
from service.pipeline import Service
from service.routes import HANDLERS, api_key_ok, encode_json, inference, unless_disconnected

log = logging.getLogger("disan.service")


def _header(scope: Scope, name: bytes) -> str | None:
    """First value of header `name` (lowercase), like Starlette's `Headers.get`."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def bearer_credentials(authorization: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>`, else None (FastAPI's HTTPBearer rules)."""
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and credentials) or scheme.lower() != "bearer":
        return None
    return credentials


def is_json(content_type: str | None) -> bool:
    """application/json or application/*+json, as FastAPI requires for a JSON body."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_body(model: Any, body: bytes, content_type: str | None) -> Any:
    """Validate `body` against the request model exactly as FastAPI does (stdlib json, then
    pydantic in python mode), raising the error its path would report."""
    if not body:
        raise InvalidRequest("body: Field required")
    if not is_json(content_type):
        raise MalformedJSON(NOT_JSON_MESSAGE)
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        raise MalformedJSON("request body is not valid JSON") from None
    except ValueError:  # undecodable bytes: FastAPI's own 400 message
        raise MalformedJSON("There was an error parsing the body") from None
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        etype, message = validation_message(exc.errors(include_url=False))
        raise (MalformedJSON if etype == "malformed_json" else InvalidRequest)(message) from None


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body (the body-limit middleware has already bounded it), None if the
    client went away."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_json(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class InferenceFastPath:
    """ASGI middleware serving POST on `routes.HANDLERS` paths; the rest goes to `app`."""

    def __init__(self, app: ASGIApp, service: Service):
        self.app = app
        self.service = service
        # The matching APIRoute goes into scope["route"], as FastAPI does, for the metrics label.
        api_routes = {getattr(r, "path", None): r for r in inference.routes}
        self.endpoints = {path: (model, handler, api_routes.get(path))
                          for path, (model, handler) in HANDLERS.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (self.endpoints.get(scope["path"])
                    if scope["type"] == "http" and scope["method"] == "POST" else None)
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        model, handler, route = endpoint
        if route is not None:
            scope["route"] = route
        try:
            # The key is checked before the body is parsed: unauthenticated bodies are never read.
            if not api_key_ok(self.service, bearer_credentials(_header(scope, b"authorization"))):
                raise Unauthorized()
            body = await _read_body(receive)
            if body is None:
                return
            request = parse_body(model, body, _header(scope, b"content-type"))
            payload = await unless_disconnected(receive, handler(request, self.service))
        except ServiceError as exc:
            message = public_message(exc, scope["path"])
            await _send_json(send, exc.status, orjson.dumps(error_body(exc.type, message)), exc.headers)
            return
        except Exception:  # same answer as the app's catch-all handler
            log.exception("unhandled error on %s", scope["path"])
            await _send_json(send, ERROR_TABLE["internal_error"][0],
                             orjson.dumps(error_body("internal_error", "internal server error")))
            return
        await _send_json(send, 200, encode_json(payload))
