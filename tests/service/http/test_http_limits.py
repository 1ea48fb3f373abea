"""A live uvicorn server with service.http.protocol (httptools): head size and time limits, the drain
deadline, and with several workers (a real `disan serve`) metrics that never go backwards and a
/ready that speaks for every worker."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from support_serving import wait_ready

from service.common.workers import WorkerReadiness
from service.http.protocol import DisanHttpToolsProtocol
from service.main import create_app
from service.settings import Settings

uvicorn = pytest.importorskip("uvicorn")
REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live(bundle, **overrides):
    """create_app + uvicorn with the service's protocol, in a thread, on 127.0.0.1."""
    settings = Settings(bundle=bundle, **overrides)
    app = create_app(settings)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=DisanHttpToolsProtocol,
                            log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=int(settings.drain_timeout_s) + 1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda url: httpx.get(url, timeout=2), base, retry=(httpx.TransportError,))
        yield base, server, app
    finally:
        server.should_exit = True
        thread.join(30)


def raw(port: int, request: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send `request` on a fresh connection; (everything read until the server closes, seconds)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        t0 = time.perf_counter()
        if request:
            s.sendall(request)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks), time.perf_counter() - t0


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def test_a_huge_header_is_431_and_the_loop_stays_free(tiny_bundle):
    with live(tiny_bundle, max_header_bytes=8 * 1024) as (base, _, _):
        port = port_of(base)
        health_ms: list[float] = []
        done = threading.Event()

        def poll_health() -> None:
            with httpx.Client(base_url=base, timeout=5) as c:
                while not done.is_set():
                    t0 = time.perf_counter()
                    assert c.get("/health").status_code == 200
                    health_ms.append((time.perf_counter() - t0) * 1000)

        poller = threading.Thread(target=poll_health)
        poller.start()
        try:
            while not health_ms:
                time.sleep(0.005)
            head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 << 20)
                    + b"\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            answer, seconds = raw(port, head)
            polled = len(health_ms)
            while len(health_ms) < polled + 3:
                time.sleep(0.005)
        finally:
            done.set()
            poller.join(10)
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
        body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["type"] == "headers_too_large"
        assert seconds < 5 and health_ms and max(health_ms) < 1000


def test_head_limit_is_exact_when_the_head_arrives_in_one_piece(tiny_bundle):
    with live(tiny_bundle, max_header_bytes=8 * 1024) as (base, _, _):
        port = port_of(base)
        over = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n"
        assert raw(port, over)[0].startswith(b"HTTP/1.1 431 ")
        under = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 6000 + b"\r\nConnection: close\r\n\r\n"
        assert raw(port, under)[0].startswith(b"HTTP/1.1 200 ")
        # Keep-alive and a POST body after the head: each head is counted on its own.
        with httpx.Client(base_url=base, headers={"X-Pad": "a" * 6000}) as c:
            for _ in range(3):
                assert c.post("/embed", json={"texts": ["a man " * 50]}).status_code == 200


def test_connections_that_never_finish_their_head_are_closed(tiny_bundle):
    with live(tiny_bundle, header_timeout_s=0.3) as (base, _, _):
        port = port_of(base)
        silent, seconds = raw(port, b"")
        assert silent == b"" and 0.2 < seconds < 3
        partial, seconds = raw(port, b"POST /embed HTTP/1.1\r\nHost: x\r\n")
        assert partial.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in partial and seconds < 3
        with httpx.Client(base_url=base) as c:  # a slow but complete client is unaffected
            assert c.get("/health").status_code == 200
            time.sleep(0.5)
            assert c.get("/health").status_code == 200


def test_past_the_drain_deadline_waiting_requests_get_a_json_503(tiny_bundle):
    """SIGTERM (uvicorn's should_exit): a request stuck in the model past drain_timeout_s is
    answered 503 with the error body, before uvicorn's own deadline would cut it off with a
    plain-text 500."""
    with live(tiny_bundle, drain_timeout_s=1.0, batch_concurrency=1, max_wait_ms=0) as (base, server, app):
        batcher = app.state.engine.batchers["encoder"]
        real, release = batcher.runner, threading.Event()
        batcher.runner = lambda rows: release.wait(10) and real(rows)
        answers: list[httpx.Response] = []

        def call() -> None:
            answers.append(httpx.post(f"{base}/embed", json={"texts": ["a man"]}, timeout=20))

        clients = [threading.Thread(target=call) for _ in range(3)]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 10
        while batcher.depth + sum(map(len, batcher._running)) < 3:  # all three are waiting
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.perf_counter()
        server.should_exit = True
        for t in clients:
            t.join(15)
        waited = time.perf_counter() - t0
        release.set()
        assert [r.status_code for r in answers] == [503] * 3, [r.text for r in answers]
        assert all(r.json()["error"]["type"] == "not_ready" for r in answers)
        assert 0.9 < waited < 1.9  # at the drain deadline, before uvicorn's (+1 s)


def test_worker_readiness_counts_live_workers_only(tmp_path):
    ours = WorkerReadiness(tmp_path, expected=2)
    assert ours.all_ready() == (False, "0 of 2 workers ready")
    ours.mark_ready()
    assert ours.all_ready() == (False, "1 of 2 workers ready")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / "ready" / gone.stdout.strip()).touch()  # a worker that was killed
    assert ours.all_ready()[0] is False
    (tmp_path / "ready" / str(os.getppid())).touch()  # a live one
    assert ours.all_ready() == (True, None)
    ours.mark_gone()
    assert ours.all_ready()[0] is False
    assert WorkerReadiness(None, expected=1).all_ready() == (True, None)


def counter_total(text: str, name: str, **labels: str) -> float:
    """Sum of a counter's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} ([0-9.e+]+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_two_workers_share_metrics_and_readiness(tiny_bundle):
    port = free_port()
    before = set(Path(tempfile.gettempdir()).glob("disan-workers-*"))
    proc = subprocess.Popen([sys.executable, "-m", "disan.cli", "serve", "--bundle", str(tiny_bundle),
                             "--port", str(port), "--workers", "2", "--log-level", "warning"],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda url: httpx.get(url, timeout=2), base, timeout=120,
                   alive=lambda: proc.poll() is None, retry=(httpx.TransportError,))
        totals, sent = [], 0
        for _ in range(12):
            for _ in range(3):
                # A new connection per call: the kernel spreads them over both workers.
                with httpx.Client(base_url=base, headers={"Connection": "close"}) as c:
                    assert c.post("/embed", json={"texts": ["a man"]}).status_code == 200
                    sent += 1
                    assert c.get("/ready").status_code == 200
            with httpx.Client(base_url=base) as c:
                text = c.get("/metrics").text
            totals.append(counter_total(text, "disan_requests_total", route="/embed", status="200"))
        assert totals == sorted(totals), totals  # never backwards between scrapes
        assert totals[-1] == sent  # every worker's requests, counted once
        shared = set(Path(tempfile.gettempdir()).glob("disan-workers-*")) - before
        assert len(shared) == 1, "disan serve made one directory for its workers' metrics"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert not shared.pop().exists(), "the shared directory is removed on exit"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

