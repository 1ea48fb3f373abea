"""Bounded load generator for a running `disan serve` (loopback only).

    python -m bench.load --url http://127.0.0.1:8000 --endpoint /embed --concurrency 8 \\
        --requests 2000 --time-limit 60 --texts-per-request 1 [--texts FILE] [--json OUT]

C workers share a fixed budget of requests and stop at the time limit, whichever comes first.
Reports throughput (requests/s, sentences/s) and latency p50/p95/p99 of successful requests,
plus counts by status. `run_load(...)` is importable for the benchmark scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEFAULT_TEXTS = [
    "A man is playing a guitar on stage.",
    "Two dogs are running through a field of snow.",
    "The movie was a gorgeous, witty, seductive film.",
    "A woman is slicing an onion in the kitchen.",
    "The children are not playing outside because it is raining.",
    "An old man sits on a bench reading the newspaper while pigeons gather around his feet.",
    "It's a bad sign when you're rooting for the film to end.",
    "Someone is riding a bicycle down a steep hill.",
]


@dataclass
class LoadResult:
    """What one load run measured."""

    endpoint: str
    concurrency: int
    texts_per_request: int
    sent: int = 0
    ok: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    requests_per_s: float = 0.0
    sentences_per_s: float = 0.0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None

    def summary(self) -> str:
        lat = (f"p50 {self.p50_ms:.1f} ms, p95 {self.p95_ms:.1f} ms, p99 {self.p99_ms:.1f} ms"
               if self.p50_ms is not None else "no successful requests")
        return (f"{self.endpoint} c={self.concurrency} x{self.texts_per_request}: {self.ok}/{self.sent} ok "
                f"in {self.seconds:.1f}s, {self.requests_per_s:.1f} req/s, "
                f"{self.sentences_per_s:.1f} sentences/s, {lat}, statuses {self.statuses}")


def check_loopback(url: str) -> None:
    """Refuse anything but a local server: this tool must never load someone else's host."""
    host = urlsplit(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"--url must point at 127.0.0.1/localhost, got host {host!r}")


def make_body(endpoint: str, texts: list[str]) -> dict:
    """Request body for `endpoint` built from `texts`."""
    if endpoint == "/nli":
        return {"pairs": [{"premise": t, "hypothesis": texts[(i + 1) % len(texts)]}
                          for i, t in enumerate(texts)], "truncate": True}
    if endpoint == "/v1/embeddings":
        return {"input": texts}
    return {"texts": texts, "truncate": True}


async def run_load(url: str, endpoint: str = "/embed", concurrency: int = 8, requests: int = 1000,
                   time_limit: float = 60.0, texts_per_request: int = 1, texts: list[str] | None = None,
                   api_key: str | None = None, seed: int = 0) -> LoadResult:
    """Send at most `requests` requests with `concurrency` workers for at most `time_limit` seconds."""
    check_loopback(url)
    if concurrency < 1 or requests < 1 or texts_per_request < 1 or time_limit <= 0:
        raise ValueError("concurrency, requests, texts-per-request and time-limit must be positive")
    pool = texts or DEFAULT_TEXTS
    rng = random.Random(seed)
    bodies = [make_body(endpoint, [rng.choice(pool) for _ in range(texts_per_request)])
              for _ in range(min(requests, 512))]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result = LoadResult(endpoint, concurrency, texts_per_request)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    budget = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:
        start = time.perf_counter()
        deadline = start + time_limit

        async def worker() -> None:
            for i in budget:  # shared iterator: the budget is global, not per worker
                if time.perf_counter() >= deadline:
                    return
                t0 = time.perf_counter()
                try:
                    r = await client.post(endpoint, json=bodies[i % len(bodies)])
                    key = str(r.status_code)
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                elapsed = time.perf_counter() - t0
                statuses[key] = statuses.get(key, 0) + 1
                if key == "200":
                    latencies.append(elapsed)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - start
    result.statuses = statuses
    result.sent = sum(statuses.values())
    result.ok = len(latencies)
    result.requests_per_s = result.ok / result.seconds if result.seconds else 0.0
    result.sentences_per_s = result.requests_per_s * texts_per_request
    if latencies:
        ms = np.asarray(latencies) * 1000
        result.p50_ms, result.p95_ms, result.p99_ms = (float(np.percentile(ms, q)) for q in (50, 95, 99))
        result.mean_ms = float(ms.mean())
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: run one bounded load test and print (or save) the result."""
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/embed", choices=["/embed", "/nli", "/sentiment", "/v1/embeddings"])
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=1000, help="total request budget")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds; stop early when reached")
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--texts", type=Path, help="file with one sentence per line (default: built-in)")
    p.add_argument("--api-key")
    p.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = p.parse_args(argv)
    texts = None
    if args.texts:
        texts = [line.strip() for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not texts:
            print(f"bench.load: {args.texts} has no sentences", file=sys.stderr)
            return 2
    try:
        result = asyncio.run(run_load(args.url, args.endpoint, args.concurrency, args.requests,
                                      args.time_limit, args.texts_per_request, texts, args.api_key))
    except ValueError as exc:
        print(f"bench.load: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n", encoding="utf-8")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
