"""Helpers for the service's tests: waiting for a server or engine to be ready (or to fail), a real
uvicorn server in a thread, and stand-ins for onnxruntime behind the micro-batcher."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def wait_ready(get: Callable, base: str = "", timeout: float = 30.0,
               alive: Callable[[], bool] | None = None, retry: tuple[type[Exception], ...] = ()) -> None:
    """Poll `get(base + "/ready")` (a TestClient's or httpx's `get`) until it answers 200.

    Fails at once if the bundle failed to load, if `alive()` says the server process died, or
    after `timeout` seconds. Exceptions in `retry` (a server still starting) are retried.
    """
    deadline = time.monotonic() + timeout
    while True:
        assert alive is None or alive(), "the server process exited"
        try:
            r = get(f"{base}/ready")
            if r.status_code == 200:
                return
            assert r.json().get("status") != "failed", r.json()
        except retry:
            pass
        assert time.monotonic() < deadline, f"not ready after {timeout:.0f} s"
        time.sleep(0.02)


def wait_failed(get: Callable, timeout: float = 30.0) -> None:
    """Poll a TestClient's `get("/health")` until the bundle's load has failed (503 "failed");
    `/ready` then answers 503 too."""
    deadline = time.monotonic() + timeout
    while get("/health").status_code == 200:
        assert time.monotonic() < deadline, f"the load did not fail within {timeout:.0f} s"
        time.sleep(0.02)
    assert get("/health").json()["status"] == "failed"
    assert get("/ready").status_code == 503


async def until_loaded(engine, timeout: float = 60.0) -> None:
    """Wait until an engine's background load has finished, well or not (`/ready` would say)."""
    deadline = time.monotonic() + timeout
    while engine.state == "loading":
        if time.monotonic() > deadline:
            raise TimeoutError("the engine did not finish loading")
        await asyncio.sleep(0.01)


@contextmanager
def serve_in_thread(settings) -> Iterator[str]:
    """A real uvicorn server for `settings` on a free 127.0.0.1 port, in a thread of this process
    (clients that open their own connections: openai, LangChain, a browser). Yields the base URL."""
    import httpx
    import uvicorn

    from service.main import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda url: httpx.get(url, timeout=2), base, timeout=60, alive=thread.is_alive,
                   retry=(httpx.TransportError,))
        yield base
    finally:
        server.should_exit = True
        thread.join(30)


def block_runner(batcher) -> tuple[threading.Event, threading.Event]:
    """Make `batcher`'s onnxruntime calls wait: returns (gate, entered). `entered` is set when a
    call starts; the call proceeds once `gate` is set (or after 10 s)."""
    gate, entered = threading.Event(), threading.Event()
    real = batcher.runner

    def blocked(rows):
        entered.set()
        gate.wait(10)
        return real(rows)

    batcher.runner = blocked
    return gate, entered


class FakeRunner:
    """Records every batch; result of an item = its payload doubled (so order mistakes show)."""

    def __init__(self, delay: float = 0.0, fail_when=None):
        self.batches: list[list] = []
        self.delay = delay
        self.fail_when = fail_when
        self.gate: threading.Event | None = None

    def __call__(self, payloads: list) -> list:
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append(list(payloads))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_when and self.fail_when(payloads):
            raise RuntimeError("boom")
        return [p * 2 for p in payloads]


def make_batcher(runner, **kw):
    """A MicroBatcher named "test" over `runner`; an item's length is its payload's length."""
    from service.backend.batcher import MicroBatcher

    kw.setdefault("length", lambda s: len(s))
    return MicroBatcher("test", runner, **kw)
