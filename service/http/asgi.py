"""ASGI I/O shared by both front ends (FastAPI's stack and the fast path).

Every POST body passes the same checks before any parsing (`BodyPolicy`): a byte limit, a read
timeout and a bound on the JSON items it can make the parser allocate. A declared Content-Length
over the limit is refused without reading; otherwise the body is read chunk by chunk (chunked
uploads have no Content-Length) and refused as soon as it exceeds the limit, so no client can make
the server buffer more than `limit` bytes. Inference requests also pass admission control
(service.inference.admission) before their body is read; `GateMiddleware` does all of it for FastAPI's
path, service.http.fastpath calls the same pieces in the same order.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Collection
from typing import TypeVar

import numpy as np
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.common.errors import (
    ClientClosed,
    InvalidRequest,
    MalformedJSON,
    RequestTimeout,
    RequestTooLarge,
    ServiceError,
    family_error_body,
)
from service.common.metrics import Metrics
from service.common.timing import CURRENT, RequestTiming
from service.http.openai_schemas import TOKEN_IDS_MESSAGE
from service.http.tei_schemas import is_tei
from service.inference.admission import Admission

T = TypeVar("T")

# The connection is closed after a 413: the rest of an oversized upload is never read.
CLOSE = {"Connection": "close"}
# A JSON string literal (escapes included); unrolled so long strings match in one C loop.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
# The start of an OpenAI token-id input: "input": [1 or "input": [[1 (see token_ids_refusal).
_TOKEN_IDS = re.compile(rb'"input"\s*:\s*\[\s*(?:\[\s*)?-?\d')
# No request of the API nests deeper than 3 levels; deeper bodies are refused before parsing
# (the stdlib parser recurses: at about 1,000 levels it raises RecursionError).
MAX_JSON_DEPTH = 32


def content_length(scope: Scope) -> int | None:
    """The request's Content-Length header, None when absent or not a number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def json_skeleton(body: bytes) -> bytes:
    """`body` with every string literal emptied: what is left is the JSON structure."""
    return _JSON_STRING.sub(b'""', body) if b'"' in body else body


def json_items(skeleton: bytes) -> int:
    """Upper bound on the values a JSON parser allocates: commas, brackets and braces, plus one."""
    return skeleton.count(b",") + skeleton.count(b"[") + skeleton.count(b"{") + 1


def json_depth(data: bytes, chunk: int = 1 << 16) -> int:
    """Deepest nesting of brackets and braces in `data` (a skeleton: exact; raw bytes: brackets
    inside strings count too). In chunks, so a 4 MiB body needs no 4M-element arrays."""
    brackets = data.translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for start in range(0, len(brackets), chunk):
        part = np.frombuffer(brackets, dtype=np.uint8, count=min(chunk, len(brackets) - start),
                             offset=start)
        # "[" is 91 and "{" is 123 (bit 1 set); "]" is 93 and "}" is 125 (bit 1 clear): +1 / -1.
        levels = depth + np.cumsum((part & 2).astype(np.int32) - 1)
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


async def read_body(scope: Scope, receive: Receive, limit: int,
                    timeout_s: float | None = None) -> bytes | None:
    """The whole body, None if the client went away; RequestTooLarge past `limit` bytes,
    RequestTimeout if it is not complete within `timeout_s` (armed only when the body does not
    arrive in the first message, so a small request pays for no timer)."""
    too_big = RequestTooLarge(f"request body over {limit} bytes", CLOSE)
    if (content_length(scope) or 0) > limit:
        raise too_big  # unread: with the body items limit, 16 MiB of token ids is not a mistake
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    first = message.get("body", b"")
    too_big.first_chunk = first  # type: ignore[attr-defined]  # token_ids_refusal looks at it
    if len(first) > limit:
        raise too_big
    if not message.get("more_body", False):
        return first
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_rest(receive, [first], len(first), limit, too_big)
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {timeout_s:g} s") from None


async def _read_rest(receive: Receive, chunks: list[bytes], size: int, limit: int,
                     too_big: RequestTooLarge) -> bytes | None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def token_ids_refusal(start: bytes, headers: dict[str, str] | None = None) -> InvalidRequest | None:
    """The answer to a body that starts as token-id input (`"input": [1, ...` or `[[1, ...`) and
    is over a size limit: LangChain's default path sends 1,000 such arrays, and "413: too many JSON
    items" would point the user the wrong way. Only the body's start is looked at (a quote inside
    a JSON string is escaped, so `"input"` cannot match inside a text)."""
    return InvalidRequest(TOKEN_IDS_MESSAGE, headers) if _TOKEN_IDS.search(start[:4096]) else None


class BodyPolicy:
    """What every request body passes before it is parsed."""

    def __init__(self, limit: int, timeout_s: float, max_json_items: int):
        self.limit = limit
        self.timeout_s = timeout_s
        self.max_json_items = max_json_items

    async def read(self, scope: Scope, receive: Receive) -> bytes | None:
        """The body (None: the client left), or RequestTooLarge / RequestTimeout; token-id
        input over a limit gets the token-id answer (`token_ids_refusal`) instead of a 413."""
        try:
            body = await read_body(scope, receive, self.limit, self.timeout_s)
        except RequestTooLarge as exc:
            raise token_ids_refusal(getattr(exc, "first_chunk", b""), CLOSE) or exc from None
        if body:
            try:
                self.check_json_shape(body)
            except RequestTooLarge as exc:
                raise token_ids_refusal(body) or exc from None
        return body

    def check_json_shape(self, body: bytes) -> None:
        """413 for too many JSON items, 400 for too deep a nesting, before any parsing. Counting
        in the raw bytes over-counts (commas and brackets inside texts) and costs next to
        nothing, so the strings are stripped only when that count is over a limit."""
        opening = body.count(b"[") + body.count(b"{")
        if opening + body.count(b",") < self.max_json_items and (
                opening <= MAX_JSON_DEPTH or json_depth(body) <= MAX_JSON_DEPTH):
            # Strings of "]" could hide nesting from the raw count; the parser's RecursionError
            # is the backstop for those (still a 400 on both paths).
            return
        skeleton = json_skeleton(body)
        if json_depth(skeleton) > MAX_JSON_DEPTH:
            raise MalformedJSON(f"request body nests deeper than {MAX_JSON_DEPTH} levels")
        items = json_items(skeleton)
        if items > self.max_json_items:
            raise RequestTooLarge(f"request body has {items} JSON items (commas, brackets and "
                                  f"braces outside strings), at most {self.max_json_items}")


async def send_json(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None,
                    raw_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A complete JSON response in two ASGI messages."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    if raw_headers:
        raw += raw_headers
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: ServiceError, tei: bool = False) -> None:
    """An error of the table, answered directly (no app below was called); `tei`: in TEI's shape
    (a route only TEI has: the body, unread, cannot say)."""
    await send_json(send, exc.status, orjson.dumps(family_error_body(tei, exc.type, exc.message)),
                    exc.headers)


class GateMiddleware:
    """FastAPI's path: body policy for every POST and, for inference paths, admission control
    (before the body is read), the request's timing (histograms and x-*-time headers)."""

    def __init__(self, app: ASGIApp, policy: BodyPolicy, admission: Admission,
                 inference_paths: Collection[str], metrics: Metrics):
        self.app = app
        self.policy = policy
        self.admission = admission
        self.inference_paths = frozenset(inference_paths)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        inference = scope["path"] in self.inference_paths
        try:
            if inference:
                await self.admission.admit(content_length(scope))
            body = await self.policy.read(scope, receive)
            if body is None:
                return
            if inference:
                self.admission.enter()
        except ServiceError as exc:
            await send_error(send, exc, is_tei(scope["path"], None))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if not inference:
            await self.app(scope, replay, send)
            return
        timing = CURRENT.get() or RequestTiming()  # the tracing's, while traced
        token = CURRENT.set(timing)

        async def send_with_timing(message: Message) -> None:
            if message["type"] == "http.response.start" and timing.inferred:
                message = {**message, "headers": [*message.get("headers", ()), *timing.headers()]}
            await send(message)

        try:
            await self.app(scope, replay, send_with_timing)
        finally:
            CURRENT.reset(token)
            self.admission.leave()
            self.metrics.on_inference(scope["path"], timing)


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` in this task; if the client disconnects first (ASGI `receive` says so), a
    watcher cancels it, so its queued sentences are skipped, and ClientClosed is raised.

    This runs on every request, so it costs one small task and no `asyncio.wait`.
    """
    this = asyncio.current_task()
    assert this is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass  # the body is already read, so only a disconnect can come
        gone = True
        this.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        this.uncancel()
        raise ClientClosed("client closed the request") from None
    finally:
        watcher.cancel()
