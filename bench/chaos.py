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
import sys
import time
from pathlib import Path

from bench.chaos_input import max_requests, odd_input
from bench.chaos_kit import Row, RssSampler, Served
from bench.chaos_load import (
    big_and_small,
    closed_loop,
    drain,
    huge_headers,
    long_and_small,
    metrics_scrapes,
    slowloris,
)


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
