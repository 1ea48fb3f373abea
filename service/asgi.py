"""ASGI I/O shared by both front ends (FastAPI's stack and the fast path).

Request bodies under a byte limit: one reader for the body-limit middleware and the fast path.

A declared Content-Length over the limit is refused without reading; otherwise the body is read
chunk by chunk (chunked uploads have no Content-Length) and refused as soon as it exceeds the
limit, so no client can make the server buffer more than `limit` bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ClientClosed, RequestTooLarge, error_body

T = TypeVar("T")

# The connection is closed after a 413: the rest of an oversized upload is never read.
CLOSE = {"Connection": "close"}


def declared_length(scope: Scope) -> int:
    """The request's Content-Length header, 0 when absent or not a number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole body, None if the client went away; RequestTooLarge past `limit` bytes."""
    too_big = RequestTooLarge(f"request body over {limit} bytes", CLOSE)
    if declared_length(scope) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
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
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_json(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """A complete JSON response in two ASGI messages."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes with 413 before any JSON parsing; the accepted
    body is replayed to the app."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.limit)
        except RequestTooLarge as exc:
            await send_json(send, exc.status, orjson.dumps(error_body(exc.type, exc.message)), exc.headers)
            return
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
