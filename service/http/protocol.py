"""uvicorn's httptools protocol with limits on the request head, and the drain signal.

uvicorn bounds the request head only for its h11 implementation (`h11_max_incomplete_event_size`);
httptools (llhttp) has no limit uvicorn can set, so a 100 MB header is parsed in full (and a
header value arriving in pieces is concatenated again and again) on the event loop. Nor does
uvicorn time a head: its keep-alive timer runs only between requests, so a connection that opens
and sends nothing, or a head one byte at a time, is held forever. This subclass adds both, at the
cost of one addition per `data_received` while a head is being read:

- more than `max_header_bytes` of request line + headers -> 431 (JSON error body), connection
  closed: checked exactly when the head completes, and as the bytes arrive while it does not;
- no complete head `header_timeout_s` after the connection opened (or after a request's first
  bytes) -> connection closed (408 first when some of a head arrived).

uvicorn calls `shutdown()` on every connection when SIGTERM arrives: the first call starts the
app's drain (service.inference.engine.Engine.begin_drain), which the app cannot see otherwise, since uvicorn
runs the lifespan shutdown only after in-flight requests are done.

The limits and the drain hook come from the app through the lifespan state (`HttpHooks` under
`HOOKS_KEY`, set by service.main), so the settings stay the one source, with any number of workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.common.errors import ERROR_TABLE, error_body

HOOKS_KEY = "disan.http"
# After an error answer the connection reads and drops what the client still sends for this long
# before closing: closing with unread data makes the kernel send a reset, which can destroy the
# answer before the client reads it (nginx's "lingering close").
LINGER_S = 1.0


@dataclass(frozen=True)
class HttpHooks:
    """What the protocol needs from the app."""

    max_header_bytes: int = 32 * 1024
    header_timeout_s: float = 10.0
    begin_drain: Callable[[], None] | None = None


def _raw_error(etype: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response of the error table that closes the connection."""
    status = ERROR_TABLE[etype][0]
    body = orjson.dumps(error_body(etype, message))
    reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}.get(status, b"Error")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))


class DisanHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol + head size and time limits + the drain signal (module docstring)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.hooks: HttpHooks = app_state.get(HOOKS_KEY) or HttpHooks()
        self._in_head = True  # the next bytes on the wire belong to a request head
        self._head_bytes = 0  # bytes received since this head began (a bound: may include body)
        self._head_size = 0  # request line + headers, exact, as parsed
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # --- connection ---
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_timer is None:
                self._arm_head_timer()
        super().data_received(data)
        if self._in_head and self._head_bytes > self.hooks.max_header_bytes and not self._refused:
            self._refuse(_raw_error("headers_too_large", f"request head over "
                                    f"{self.hooks.max_header_bytes} bytes"))

    def shutdown(self) -> None:
        if self.hooks.begin_drain is not None:
            self.hooks.begin_drain()
        super().shutdown()

    # --- parser callbacks ---
    def on_message_begin(self) -> None:
        self._head_size = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        if self._head_size > self.hooks.max_header_bytes:
            self._refuse(_raw_error("headers_too_large", f"request head of {self._head_size} bytes, "
                                    f"at most {self.hooks.max_header_bytes}"))
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._in_head = True  # what follows on this connection is the next request's head

    # --- helpers ---
    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.hooks.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes:
            self._refuse(_raw_error("request_timeout", f"request head not received within "
                                    f"{self.hooks.header_timeout_s:g} s"))
        else:
            self._refused = True
            self.transport.close()

    def _refuse(self, response: bytes) -> None:
        """Answer, stop reading requests from this connection, close it after LINGER_S."""
        self._refused = True
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
