"""Attack a live `disan serve` on 127.0.0.1 the way an operator's worst day would (issue 14).

    python -m bench.chaos --bundle models/default [--workers 2] [--seconds 20] [--json OUT]

Starts the server (loopback only, with the file-descriptor limit of a default host, 1,024), warms
it up for 3 s (16 clients x 32 sentences, not counted: admission control learns the seconds per
sentence from the first calls), then runs each attack for a bounded time and request count and
prints one row per attack: requests
sent, answers by status (`err` = no answer: reset, timeout), goodput (sentences/s answered 200),
p50/p99 of the well-behaved clients (what each attack's `probe` measures) and the server's RSS
before, at the peak, and after (all worker processes together). The attacks:

- `peak`: 64 clients x 32 sentences, closed loop: the goodput to compare the others with.
- `overload`: 256 clients x 32 sentences that retry at once after a 429 (4x the peak's clients);
  probe = the accepted requests.
- `big+small`: 4 clients in a loop with 256 x 128-token /embed requests; probe = one client
  sending one-sentence /embed requests one after another.
- `long+small`: 4 clients in a loop each sending one 5,000-token document per /embed request
  (embedded in windows of max_tokens, the default); probe = the one-sentence client as above
  (issue 27's goal: p99 < 100 ms on the 2-core machine). Goodput counts documents.
- `headers`: 4 clients sending 1 MB headers in a loop; probe = /health; the 431s' own latency
  is reported in the row's note.
- `slowloris`: 2,200 connections that send half a request head and nothing more (past the fd
  limit of each of 2 workers), held for header_timeout_s + 4 s; probe = /health on fresh
  connections.
- `max requests`: the largest requests, each alone (the note gives each one's RSS growth at its
  peak and after), then 6 explain requests at their limits at once whose answers are never read
  (explain at its limits, 256 x 10,000-character texts, 256 pairs of 8,000-character texts, 128
  windowed texts at the per-text and per-request token limits, 4 MiB JSON-item and nesting
  bombs, explain over its limits).
- `metrics`: 16 clients sending /embed while /metrics is scraped on a fresh connection (any
  worker may answer) every 50 ms; the note counts scrapes where a counter went backwards.
- `drain` (always last: it stops the server): 24 clients each send one 256 x 128-token /embed,
  SIGTERM follows 1.5 s later; the note says how each was answered (a plain-text 500 is
  uvicorn's, cut off at its deadline), when the last answer came and when the server exited.
- `odd input`: deep JSON, lone surrogates, NUL and control characters, RTL and combining marks,
  emoji, invalid UTF-8, wrong types; probe = all of them; any 5xx is a failure.

Clients run in this process (asyncio, raw HTTP/1.1 on keep-alive connections: far cheaper than an
HTTP library) on the same host as the server, so they compete with it for the CPU like the
issue's clients did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.chaos_kit import DEFAULT_TEXTS, HOST, NO_ANSWER, Conn, Row, RssSampler, Served, embed_body
from disan.text import tokenize


# ------------------------------------------------------------------ attacks
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


MAX_REQUESTS = {
    "explain at its limits (8 x 128 tokens)":
        ("/sentiment", {"texts": [" ".join(["word"] * 200)] * 8, "truncate": True, "explain": True}),
    "explain 256 x 128 tokens":
        ("/sentiment", {"texts": [" ".join(["word"] * 200)] * 256, "truncate": True, "explain": True}),
    "256 x 10,000 characters":
        ("/embed", {"texts": ["the movie was great and " * 416 + "ok"] * 256, "truncate": True}),
    "256 pairs x 2 x 8,000 characters":
        ("/nli", {"pairs": [{"premise": "a man " * 1333, "hypothesis": "a dog " * 1333}] * 256,
                  "truncate": True}),
    # the default long_text=window at its limits: 128 texts x 8,190 tokens (under
    # max_tokens_per_text), 1.05M tokens (just under max_tokens_per_request), 8,192 windows
    "windowed 128 x 8,190 tokens":
        ("/embed", {"texts": ["the movie was great and " * 1638] * 128}),
}
_HALF = (4 << 20) // 2 - 16  # two bytes per item: the bodies stay just under 4 MiB
BOMBS = {
    "4 MiB of JSON items": b'{"texts": [' + b"1," * _HALF + b"1]}",
    "4 MiB of nesting": b'{"texts": ' + b"[" * _HALF + b"]" * _HALF + b"}",
}


async def max_requests(port: int, row: Row, served: Served) -> None:
    bodies = {name: (path, json.dumps(body).encode()) for name, (path, body) in MAX_REQUESTS.items()}
    bodies.update({name: ("/embed", body) for name, body in BOMBS.items()})
    notes = []
    for name, (path, body) in bodies.items():
        assert len(body) <= 16 << 20, (name, len(body))
        conn = Conn(port)
        await asyncio.sleep(0.5)
        before = served.rss_mb()
        with RssSampler(served) as rss:
            try:
                status, answer = await conn.request("POST", path, body, timeout=600)
                row.count(str(status))
            except NO_ANSWER:
                row.count("err")
                status, answer = 0, b""
            await asyncio.sleep(0.5)
        after = served.rss_mb()
        notes.append(f"{name} ({len(body) / 2**20:.1f} MiB): {status}, {len(answer) / 1e6:.1f} MB "
                     f"answer, RSS +{rss.peak - before:.0f} MB at peak, +{after - before:.0f} after")
        conn.close()
    # Six clients that send the heaviest accepted request and never read the answer.
    path, body = bodies["explain at its limits (8 x 128 tokens)"]
    silent = [Conn(port) for _ in range(6)]
    for conn in silent:
        await conn.request("POST", path, body, read=False)
        row.count("unread")
    await asyncio.sleep(10)
    for conn in silent:
        conn.close()
    await asyncio.sleep(1)
    row.note = "; ".join(notes)


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


ODD_TEXTS = ["\ud800 lone surrogate", "nul \x00 inside", "\u202e\u0645\u0631\u062d\u0628\u0627 rtl",
             "e\u0301\u0301\u0301 combining", "\U0001f600\U0001f680 emoji", "\x1b[31m ansi \x07",
             "\ufeff bom", "\u3000ideographic\u3000space", "a" * 10_000, "\u00ad soft hyphen"]


async def odd_input(port: int, row: Row) -> None:
    bodies: list[tuple[str, bytes]] = []
    for text in ODD_TEXTS:
        encoded = json.dumps({"texts": [text], "truncate": True}).encode()  # \ud800 as an escape
        bodies += [("/embed", encoded), ("/sentiment", encoded.replace(b"}", b', "explain": true}')),
                   ("/v1/embeddings", json.dumps({"input": text}).encode()),
                   ("/nli", json.dumps({"pairs": [{"premise": text, "hypothesis": text}],
                                        "truncate": True}).encode())]
    bodies += [("/embed", b'{"texts": ["\xff\xfe invalid utf-8"]}'), ("/embed", b'{"texts": [1e999]}'),
               ("/embed", b'{"texts": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
               ("/embed", b'{"texts": ["a"], "normalize": "yes"}'), ("/embed", b"\x00\x00"),
               ("/nli", b'{"pairs": [[1, 2]]}'), ("/v1/embeddings", b'{"input": [[1, 2, 3]]}')]
    conn = Conn(port)
    fives = []
    for path, body in bodies:
        t0 = time.perf_counter()
        try:
            status, answer = await conn.request("POST", path, body, timeout=30)
        except NO_ANSWER:
            row.count("err")
            conn.close()
            continue
        row.probe_ms.append((time.perf_counter() - t0) * 1000)
        row.count(str(status))
        if status >= 500:
            fives.append(f"{path} {body[:40]!r}: {answer[:120]!r}")
    conn.close()
    row.note = "5xx: " + " | ".join(fives) if fives else "no 5xx"


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


# ------------------------------------------------------------------ driver
def run_attack(served: Served, name: str, coro_factory) -> Row:
    row = Row(name)
    time.sleep(1.0)  # let the previous attack's connections close
    row.rss_before_mb = served.rss_mb()
    with RssSampler(served) as rss:
        t0 = time.perf_counter()
        asyncio.run(coro_factory(row))
        row.seconds = time.perf_counter() - t0
    time.sleep(1.0)
    row.rss_peak_mb = rss.peak
    row.rss_after_mb = served.rss_mb()
    return row


def table(rows: list[Row], peak: float) -> str:
    head = ("| attack | s | requests | answers by status | goodput (sent/s) | vs peak | probe p50 ms | "
            "probe p99 ms | RSS before / peak / after MB |")
    lines = [head, "| " + " | ".join(["---"] * 9) + " |"]
    for r in rows:
        p50, p99 = r.percentile(50), r.percentile(99)
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(r.statuses.items()))
        ratio = f"{r.goodput / peak:.0%}" if peak and r.attack == "overload" else "-"
        lines.append(f"| {r.attack} | {r.seconds:.0f} | {r.requests} | {statuses} | {r.goodput:.0f} | "
                     f"{ratio} | {p50 if p50 is None else f'{p50:.1f}'} | "
                     f"{p99 if p99 is None else f'{p99:.1f}'} | "
                     f"{r.rss_before_mb:.0f} / {r.rss_peak_mb:.0f} / {r.rss_after_mb:.0f} |")
    notes = [f"- {r.attack}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers (the CPU compose default)")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each timed attack")
    p.add_argument("--max-requests", type=int, default=200_000, help="request budget per attack")
    p.add_argument("--only", nargs="*", help="run only these attacks (by name)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    p.add_argument("serve_args", nargs="*", help="extra `disan serve` flags, after --")
    args = p.parse_args(argv)
    if not (args.bundle / "manifest.json").is_file():
        print(f"bench.chaos: no bundle at {args.bundle}", file=sys.stderr)
        return 2
    secs, budget = args.seconds, args.max_requests
    attacks = {
        "peak": lambda port: lambda row: closed_loop(port, row, 64, 32, secs, budget, True),
        "overload": lambda port: lambda row: closed_loop(port, row, 256, 32, secs, budget, True),
        "big+small": lambda port: lambda row: big_and_small(port, row, secs),
        "long+small": lambda port: lambda row: long_and_small(port, row, secs),
        "headers": lambda port: lambda row: huge_headers(port, row, min(secs, 10), budget),
        "slowloris": lambda port: lambda row: slowloris(port, row, 14.0, 2200),
        "max requests": lambda port: lambda row: max_requests(port, row, served),
        "metrics": lambda port: lambda row: metrics_scrapes(port, row, min(secs, 10)),
        "odd input": lambda port: lambda row: odd_input(port, row),
        "drain": lambda port: lambda row: drain(port, row, served),
    }
    chosen = [a for a in attacks if not args.only or a in args.only]
    served = Served(args.bundle, args.workers, args.serve_args)
    rows: list[Row] = []
    try:
        asyncio.run(closed_loop(served.port, Row("warm-up"), 16, 32, 3.0, budget, False))
        for name in chosen:
            print(f"bench.chaos: {name} ...", file=sys.stderr, flush=True)
            rows.append(run_attack(served, name, attacks[name](served.port)))
    finally:
        served.stop()
    peak = next((r.goodput for r in rows if r.attack == "peak"), 0.0)
    print(table(rows, peak))
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "seconds": secs, "cpus": os.cpu_count(),
                                         "rows": [r.summary() for r in rows]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
