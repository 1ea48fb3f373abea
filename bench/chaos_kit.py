"""bench.chaos's kit: result rows, a minimal raw HTTP/1.1 client (cheap enough to be many
clients in one process), the `disan serve` under attack and its RSS. See bench/chaos.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench.load import DEFAULT_TEXTS
from bench.server import free_port, process_tree, stop_process, wait_until_ready

HOST = "127.0.0.1"  # the only host this tool ever connects to
FD_LIMIT = 1024
NO_ANSWER = (OSError, TimeoutError, asyncio.IncompleteReadError)  # reset, closed, timed out


@dataclass
class Row:
    """One attack's outcome."""

    attack: str
    seconds: float = 0.0
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    sentences_ok: int = 0
    probe_ms: list[float] = field(default_factory=list)
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    note: str = ""

    @property
    def goodput(self) -> float:
        return self.sentences_ok / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float | None:
        return float(np.percentile(self.probe_ms, q)) if self.probe_ms else None

    def count(self, status: str, n: int = 1) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + n
        self.requests += n

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("probe_ms")
        out.update(goodput=round(self.goodput, 1), probe_n=len(self.probe_ms),
                   probe_p50_ms=self.percentile(50), probe_p99_ms=self.percentile(99))
        return out


# ------------------------------------------------------------------ a minimal HTTP/1.1 client
class Conn:
    """One keep-alive connection; `request` returns (status, body) or raises OSError/timeouts."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"", headers: bytes = b"",
                      read: bool = True, timeout: float = 60.0) -> tuple[int, bytes]:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        assert self.reader is not None
        head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n").encode() + headers + b"\r\n"
        self.writer.write(head + body)
        if not read:
            return 0, b""
        try:
            return await asyncio.wait_for(self._response(), timeout)
        except BaseException:
            self.close()
            raise

    async def _response(self) -> tuple[int, bytes]:
        assert self.reader is not None
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("closed without an answer")
        status = int(status_line.split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        body = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def embed_body(n: int, rng: random.Random, text: str | None = None) -> bytes:
    return json.dumps({"texts": [text or rng.choice(DEFAULT_TEXTS) for _ in range(n)],
                       "truncate": True}).encode()


# ------------------------------------------------------------------ the server and its RSS
class Served:
    """`disan serve` on 127.0.0.1 with the fd limit of a default host."""

    def __init__(self, bundle: Path, workers: int, extra: list[str]):
        self.port = free_port()
        env = {**os.environ, "DISAN_LOG_LEVEL": "warning"}

        def limit_fds() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

        cmd = [sys.executable, "-m", "disan.cli", "serve", "--bundle", str(bundle), "--host", HOST,
               "--port", str(self.port), "--workers", str(workers), *extra]
        self.proc = subprocess.Popen(cmd, env=env, preexec_fn=limit_fds)
        if not wait_until_ready(f"http://{HOST}:{self.port}", 180):
            self.stop()
            raise RuntimeError("server not ready in 180 s")

    def rss_mb(self) -> float:
        """RSS of the server process and its workers together."""
        total = 0
        for pid in process_tree(self.proc.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return total / 1024

    def stop(self) -> None:
        stop_process(self.proc, 60)


class RssSampler:
    """Samples the server's RSS every 20 ms in a thread; `peak` is the highest seen."""

    def __init__(self, served: Served):
        self.served = served
        self.peak = served.rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.served.rss_mb())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
