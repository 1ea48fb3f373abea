"""Fast path for the inference routes: FastAPI's handlers and contract, without its per-request cost.

With one sentence per request, FastAPI's routing, dependency solving, body parsing and middleware
stack cost about as much CPU as the model itself (bench/overhead.py; the figures are in
bench/RESULTS.md, "per-request overhead").

`DisanApp.__call__` (service.main) hands a request to `InferenceFastPath` before FastAPI's
middleware stack runs when `claims` says so: POST on a path of `endpoints.HANDLERS`, and no CORS
`Origin` to answer (browsers' requests take FastAPI's path, which has the CORS middleware). Every
other request, OpenAPI included, is FastAPI's. What the stack would have done is done here with
the same code: admission control before the body is read, the body policy
(`service.http.asgi.BodyPolicy`), the request metrics (`Metrics.on_request`, `Metrics.on_inference`),
the timing headers, the request models and parsing (stdlib json, then strict pydantic), the
handlers, the API-key check and the error table. tests/service/http/test_fastpath.py checks both paths give
identical answers; one deliberate difference: the API key is checked before the body is read
(FastAPI decodes the JSON first, so a keyless malformed body gets 400 there and 401 here).
`Settings.fast_path=false` turns the fast path off (e.g. to trace requests with FastAPI's
telemetry), and the API tests run against both.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import Token
from typing import Any

import orjson
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from service.common.errors import (
    ERROR_TABLE,
    NOT_JSON_MESSAGE,
    InvalidRequest,
    MalformedJSON,
    ServiceError,
    Unauthorized,
    family_error_body,
    public_message,
    validation_message,
)
from service.common.metrics import Metrics
from service.common.timing import CURRENT, RequestTiming
from service.http.asgi import BodyPolicy, content_length, send_error, send_json, unless_disconnected
from service.http.endpoints import HANDLERS
from service.http.handlers import api_key_ok, encode_json
from service.http.tei_schemas import is_tei
from service.inference.admission import Admission
from service.inference.engine import Engine

log = logging.getLogger("disan.service")


def header_value(scope: Scope, name: bytes) -> str | None:
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
    return validate_body(model, load_json(body, content_type))


def load_json(body: bytes, content_type: str | None) -> Any:
    """The body's JSON, parsed as FastAPI parses it, or the error its path would report."""
    if not body:
        raise InvalidRequest("body: Field required")
    if not is_json(content_type):
        raise MalformedJSON(NOT_JSON_MESSAGE)
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        raise MalformedJSON("request body is not valid JSON") from None
    except RecursionError:  # FastAPI's path answers this 400 too
        raise MalformedJSON("request body nests too deeply") from None
    except ValueError:  # undecodable bytes: FastAPI's own 400 message
        raise MalformedJSON("There was an error parsing the body") from None
    return data


def validate_body(model: Any, data: Any) -> Any:
    """`data` as the request model (strict pydantic, python mode), or FastAPI's path's error."""
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        etype, message = validation_message(exc.errors(include_url=False))
        raise (MalformedJSON if etype == "malformed_json" else InvalidRequest)(message) from None


class InferenceFastPath:
    """Serves POST on `endpoints.HANDLERS` paths ahead of FastAPI (see the module docstring)."""

    def __init__(self, engine: Engine, metrics: Metrics, policy: BodyPolicy, admission: Admission,
                 cors: bool):
        self.engine = engine
        self.metrics = metrics
        self.policy = policy
        self.admission = admission
        self.cors = cors
        self.endpoints = dict(HANDLERS)

    def claims(self, scope: Scope) -> bool:
        """Whether this request is the fast path's to answer."""
        return (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.endpoints
                and not (self.cors and header_value(scope, b"origin") is not None))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        t0 = time.perf_counter()
        status = 500  # what the metrics say if the client leaves before an answer is sent
        timing = CURRENT.get() or RequestTiming()  # the tracing's, while traced
        token: Token | None = None
        admitted = False
        try:
            try:
                # Admission and the key come before the body is read: refused or unauthenticated
                # bodies are never read, let alone parsed.
                await self.admission.admit(content_length(scope))
                if not api_key_ok(self.engine, bearer_credentials(header_value(scope, b"authorization"))):
                    raise Unauthorized()
                body = await self.policy.read(scope, receive)
                if body is None:
                    return
                self.admission.enter()
                admitted = True
            except ServiceError as exc:
                status = exc.status
                await send_error(send, exc, is_tei(path, None))
                return
            token = CURRENT.set(timing)
            status, body, headers = await self._answer(path, scope, receive, body)
            await send_json(send, status, body, headers, timing.headers())
        finally:
            if token is not None:
                CURRENT.reset(token)
            if admitted:
                self.admission.leave()
            self.metrics.on_request(path, "POST", status, time.perf_counter() - t0)
            self.metrics.on_inference(path, timing)

    async def _answer(self, path: str, scope: Scope, receive: Receive,
                      body: bytes) -> tuple[int, bytes, dict]:
        """(status, JSON body, headers) of an admitted request; errors in the shape of the
        request's family (TEI's or ours: service.http.tei_schemas.is_tei)."""
        model, handler = self.endpoints[path]
        data = None
        try:
            data = load_json(body, header_value(scope, b"content-type"))
            request = validate_body(model, data)
            payload = await unless_disconnected(receive, handler(request, self.engine))
        except ServiceError as exc:
            message = public_message(exc, path)
            error = family_error_body(is_tei(path, data), exc.type, message, exc.param, exc.code)
            return exc.status, orjson.dumps(error), exc.headers
        except Exception:  # same answer as the app's catch-all handler
            log.exception("unhandled error on %s", path)
            return (ERROR_TABLE["internal_error"][0], orjson.dumps(
                family_error_body(is_tei(path, data), "internal_error", "internal server error")), {})
        return 200, encode_json(payload), {}
