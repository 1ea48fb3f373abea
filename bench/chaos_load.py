"""The load side of `bench/chaos.py`'s attacks: closed-loop clients, big or long requests beside a
one-sentence probe, 1 MB headers, slowloris, /metrics scrapes under load and a drain on SIGTERM.
Each attack fills one `Row`; the driver and its table are in `bench/chaos.py`.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import time
from collections.abc import Callable

import numpy as np

from bench.chaos_kit import DEFAULT_TEXTS, HOST, NO_ANSWER, Conn, Row, Served, embed_body
from disan.text.tokenizer import tokenize


async def closed_loop(port: int, row: Row, clients: int, sentences: int, seconds: float,
                      max_requests: int, probe_all: bool) -> None:
    """`clients` connections each sending `sentences`-sentence /embed requests back to back
    (after a 429 too: at once, ignoring Retry-After)."""
    rng = random.Random(0)
    bodies = [embed_body(sentences, rng) for _ in range(64)]
    deadline = time.perf_counter() + seconds
    budget = iter(range(max_requests))

    async def client(i: int) -> None:
        conn = Conn(port)
        for n in budget:
            if time.perf_counter() >= deadline:
                break
            t0 = time.perf_counter()
            try:
                status, _ = await conn.request("POST", "/embed", bodies[(i + n) % len(bodies)], timeout=30)
            except NO_ANSWER:
                row.count("err")
                conn.close()
                continue
            row.count(str(status))
            if status == 200:
                row.sentences_ok += sentences
                if probe_all:
                    row.probe_ms.append((time.perf_counter() - t0) * 1000)
        conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))


async def embed_loop(port: int, row: Row, deadline: float, body: Callable[[], bytes], sentences: int,
                     timeout: float) -> None:
    """Background load: /embed requests one after another on one connection until the deadline."""
    conn = Conn(port)
    while time.perf_counter() < deadline:
        try:
            status, _ = await conn.request("POST", "/embed", body(), timeout=timeout)
        except NO_ANSWER:
            row.count("err")
            continue
        row.count(str(status))
        row.sentences_ok += sentences if status == 200 else 0
    conn.close()


async def small_probe(port: int, row: Row, deadline: float, rng: random.Random) -> None:
    """One client sending one-sentence /embed requests one after another (20 ms apart) while the
    big requests run: the head-of-line latency the probe columns report."""
    conn = Conn(port)
    await asyncio.sleep(1.0)  # the big requests are in flight first
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        try:
            status, _ = await conn.request("POST", "/embed", embed_body(1, rng), timeout=30)
        except NO_ANSWER:
            row.count("err")
            continue
        row.count(str(status))
        if status == 200:
            row.sentences_ok += 1
            row.probe_ms.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.02)
    conn.close()


async def big_and_small(port: int, row: Row, seconds: float) -> None:
    rng = random.Random(1)
    big = embed_body(256, rng, " ".join(["word"] * 200))  # 256 x 128 tokens after truncation
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(embed_loop(port, row, deadline, lambda: big, 256, 120) for _ in range(4)),
                         small_probe(port, row, deadline, rng))


def long_document(tokens: int) -> str:
    """A text of `tokens` tokens made of the default sentences (one after another)."""
    words: list[str] = []
    while len(words) < tokens:
        words += tokenize(" ".join(DEFAULT_TEXTS))
    return " ".join(words[:tokens])


async def long_and_small(port: int, row: Row, seconds: float, clients: int = 4) -> None:
    """`clients` connections each sending one 5,000-token document per /embed request (windowed,
    the default) in a loop, beside the one-sentence probe."""
    rng = random.Random(2)
    doc = json.dumps({"texts": [long_document(5000)]}).encode()
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(embed_loop(port, row, deadline, lambda: doc, 1, 120) for _ in range(clients)),
                         small_probe(port, row, deadline, rng))


async def health_probe(port: int, row: Row, until: asyncio.Event, fresh: bool = False) -> int:
    """GET /health every 20 ms until `until` is set (a fresh connection each time if `fresh`);
    returns how many attempts got no answer."""
    failed = 0
    conn = Conn(port)
    while not until.is_set():
        t0 = time.perf_counter()
        try:
            status, _ = await conn.request("GET", "/health", timeout=5)
            if status == 200:
                row.probe_ms.append((time.perf_counter() - t0) * 1000)
        except NO_ANSWER:
            failed += 1
        if fresh:
            conn.close()
        await asyncio.sleep(0.02)
    conn.close()
    return failed


async def huge_headers(port: int, row: Row, seconds: float, max_requests: int) -> None:
    header = b"X-Big: " + b"a" * (1 << 20) + b"\r\n"
    refusals: list[float] = []
    done = asyncio.Event()
    deadline = time.perf_counter() + seconds
    budget = iter(range(max_requests))

    async def attacker() -> None:
        for _ in budget:
            if time.perf_counter() >= deadline:
                break
            conn = Conn(port)
            t0 = time.perf_counter()
            try:
                status, _ = await conn.request("POST", "/embed", b"{}", header, timeout=10)
                row.count(str(status))
                if status == 431:
                    refusals.append((time.perf_counter() - t0) * 1000)
            except NO_ANSWER:
                row.count("err")
            conn.close()

    probe = asyncio.ensure_future(health_probe(port, row, done))
    await asyncio.gather(*(attacker() for _ in range(4)))
    done.set()
    await probe
    if refusals:
        row.note = (f"431 after p50 {np.percentile(refusals, 50):.1f} ms, "
                    f"p99 {np.percentile(refusals, 99):.1f} ms (1 MB sent)")


async def slowloris(port: int, row: Row, hold_s: float, connections: int) -> None:
    socks: list[socket.socket] = []
    refused = 0
    for _ in range(connections):
        s = socket.socket()
        s.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, (HOST, port)), 2)
            s.send(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except (OSError, TimeoutError):
            refused += 1
            s.close()
    row.count("held", len(socks))
    if refused:
        row.count("err", refused)
    early, late = asyncio.Event(), asyncio.Event()
    probe = asyncio.ensure_future(health_probe(port, row, early, fresh=True))
    await asyncio.sleep(hold_s - 3)  # past the server's header timeout (10 s by default)
    early.set()
    failed = await probe
    late_probe = asyncio.ensure_future(health_probe(port, row, late, fresh=True))
    await asyncio.sleep(3)
    late.set()
    failed_late = await late_probe
    closed = 0
    for s in socks:
        try:
            closed += s.recv(4096, socket.MSG_DONTWAIT | socket.MSG_PEEK) is not None
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    row.note = (f"{len(socks)} half-open connections held, {closed} closed by the server within "
                f"{hold_s:g} s; /health probes without an answer: {failed} in the first "
                f"{hold_s - 3:g} s, {failed_late} in the last 3 s")


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of counter `name` in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def metrics_scrapes(port: int, row: Row, seconds: float) -> None:
    rng = random.Random(2)
    deadline = time.perf_counter() + seconds
    names = ("disan_requests_total", "disan_sentences_total", "disan_request_tokens_count")
    seen: dict[str, list[float]] = {name: [] for name in names}

    async def scrape() -> None:
        while time.perf_counter() < deadline:
            conn = Conn(port)  # a fresh connection: the kernel picks the worker
            t0 = time.perf_counter()
            try:
                status, text = await conn.request("GET", "/metrics", timeout=10)
            except NO_ANSWER:
                row.count("err")
                continue
            finally:
                conn.close()
            row.probe_ms.append((time.perf_counter() - t0) * 1000)
            for name in names:
                seen[name].append(metric_sum(text.decode(), name))
            await asyncio.sleep(0.05)

    load = [embed_loop(port, row, deadline, lambda: embed_body(4, rng), 4, 30) for _ in range(16)]
    await asyncio.gather(*load, scrape())
    backwards = {name: sum(b < a for a, b in zip(v, v[1:], strict=False)) for name, v in seen.items()}
    row.note = (f"{len(seen[names[0]])} scrapes; counters going backwards: "
                + ", ".join(f"{name} {n}" for name, n in backwards.items()))


async def drain(port: int, row: Row, served: Served, clients: int = 24) -> None:
    body = embed_body(256, random.Random(3), " ".join(["word"] * 200))
    answers: list[str] = []
    last = [0.0]

    async def client() -> None:
        conn = Conn(port)
        try:
            status, answer = await conn.request("POST", "/embed", body, timeout=120)
            kind = "json" if answer.startswith(b"{") else "text"
            answers.append(f"{status} {kind}")
            row.count(str(status))
        except NO_ANSWER:
            answers.append("err")
            row.count("err")
        last[0] = time.perf_counter()
        conn.close()

    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    await asyncio.sleep(1.5)
    t0 = time.perf_counter()
    served.proc.send_signal(signal.SIGTERM)
    await asyncio.gather(*tasks)
    code = await asyncio.get_running_loop().run_in_executor(None, served.proc.wait, 120)
    exited = time.perf_counter() - t0
    kinds = ", ".join(f"{k}: {answers.count(k)}" for k in sorted(set(answers)))
    row.note = (f"answers {kinds}; the last {last[0] - t0:.1f} s after SIGTERM; exit code {code} "
                f"after {exited:.1f} s")
