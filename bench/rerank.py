"""What rerank and sparse vectors cost, and what a stream of reranks does to a one-sentence request.

    python -m bench.rerank --bundle models/default [--workers 2] [--rounds 30] [--seconds 20] [--json OUT]

Starts `disan serve` on 127.0.0.1 (bench/chaos_kit.py's `Served`), warms it up, then:

- `cost`: `rounds` x (one `POST /rerank` of `passages` passages for one query, then one `POST /embed`
  of the same passages + 1 texts), one request at a time on one connection, interleaved so both
  see the same machine; the ratio of their median latencies (rerank / embed) is the row's note.
  Rerank embeds the query and the passages in one pass through the batcher, so it should cost no
  more than /embed of them all (issue 81's goal: ratio <= 1 within the noise of one run). Where
  the bundle has a lexical table, `POST /embed_sparse` of the same texts is interleaved too
  (tokenizing and weighing only: no graph runs), and so is the same rerank with `"hybrid": 0.3`
  (the dense pass plus both sides' sparse vectors).
- `rerank+small`: `clients` connections each sending that rerank in a loop, beside one client
  sending one-sentence /embed requests 20 ms apart (bench/chaos_load.py's probe); the probe's
  p50/p99 (goal: p99 < 100 ms on the 2-core machine, as `long+small` in bench/chaos.py).

Loopback only, bounded in rounds and seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from bench.chaos import table
from bench.chaos_kit import DEFAULT_TEXTS, NO_ANSWER, Conn, Row, Served
from bench.chaos_load import closed_loop, small_probe
from disan.bundle.manifest import load_manifest


def passages(n: int, rng: random.Random) -> list[str]:
    """`n` passages of two or three of the default sentences each (about 20-40 tokens)."""
    return [" ".join(rng.sample(DEFAULT_TEXTS, rng.randint(2, 3))) for _ in range(n)]


HYBRID = 0.3  # the hybrid rerank's weight (any w > 0 costs the same)


def bodies(n: int, seed: int = 0) -> tuple[bytes, bytes, bytes, bytes]:
    """(the /rerank body, the /embed and the /embed_sparse bodies of the same query + passages, the
    /rerank body with `hybrid`)."""
    rng = random.Random(seed)
    query, texts = rng.choice(DEFAULT_TEXTS), passages(n, rng)
    return (json.dumps({"query": query, "texts": texts}).encode(),
            json.dumps({"texts": [query, *texts], "normalize": True}).encode(),
            json.dumps({"inputs": [query, *texts]}).encode(),
            json.dumps({"query": query, "texts": texts, "hybrid": HYBRID}).encode())


async def cost(port: int, row: Row, rounds: int, n: int, sparse: bool) -> dict[str, float]:
    """Median ms of /rerank, /embed (and /embed_sparse) of the same texts, interleaved (module
    docstring)."""
    rerank, embed, sparse_body, hybrid = bodies(n)
    conn = Conn(port)
    routes = [("/rerank", "/rerank", rerank), ("/embed", "/embed", embed)]
    if sparse:
        routes += [("/embed_sparse", "/embed_sparse", sparse_body), ("/rerank hybrid", "/rerank", hybrid)]
    times: dict[str, list[float]] = {label: [] for label, _, _ in routes}
    for i in range(rounds + 2):
        for label, path, body in routes:
            t0 = time.perf_counter()
            status, _ = await conn.request("POST", path, body, timeout=60)
            row.count(str(status))
            if status == 200 and i >= 2:  # the first two rounds warm the path up
                times[label].append(time.perf_counter() - t0)
                row.sentences_ok += n + 1
    conn.close()
    medians = {path: statistics.median(t) * 1000 for path, t in times.items()}
    row.probe_ms = [t * 1000 for t in times["/rerank"]]  # the table's probe columns: rerank's latency
    ratio = medians["/rerank"] / medians["/embed"]
    row.note = (f"{n} passages + 1 query: /rerank median {medians['/rerank']:.1f} ms, /embed of the same "
                f"{n + 1} texts {medians['/embed']:.1f} ms, ratio {ratio:.2f} ({rounds} rounds each, "
                "interleaved)")
    if sparse:
        row.note += (f"; /embed_sparse of them {medians['/embed_sparse']:.1f} ms, "
                     f"{medians['/embed_sparse'] / medians['/embed']:.2f} of /embed; /rerank with hybrid "
                     f"{HYBRID} {medians['/rerank hybrid']:.1f} ms, "
                     f"{medians['/rerank hybrid'] / medians['/rerank']:.2f} of /rerank")
    return medians


async def rerank_loop(port: int, row: Row, deadline: float, body: bytes, n: int) -> None:
    """Background load: /rerank requests one after another on one connection until the deadline."""
    conn = Conn(port)
    while time.perf_counter() < deadline:
        try:
            status, _ = await conn.request("POST", "/rerank", body, timeout=120)
        except NO_ANSWER:
            row.count("err")
            continue
        row.count(str(status))
        row.sentences_ok += n + 1 if status == 200 else 0
    conn.close()


async def rerank_and_small(port: int, row: Row, seconds: float, clients: int, n: int) -> None:
    rerank = bodies(n, seed=1)[0]
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(rerank_loop(port, row, deadline, rerank, n) for _ in range(clients)),
                         small_probe(port, row, deadline, random.Random(2)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rerank", description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers (the CPU compose default)")
    p.add_argument("--passages", type=int, default=100)
    p.add_argument("--rounds", type=int, default=30,
                   help="timed /rerank, /embed (and /embed_sparse, hybrid /rerank) requests each")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of rerank+small")
    p.add_argument("--clients", type=int, default=4, help="rerank clients beside the probe")
    p.add_argument("--machine", default="", help="what it ran on, recorded in the JSON")
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    p.add_argument("serve_args", nargs="*", help="extra `disan serve` flags, after --")
    args = p.parse_args(argv)
    if not (args.bundle / "manifest.json").is_file():
        print(f"bench.rerank: no bundle at {args.bundle}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    served = Served(args.bundle, args.workers, args.serve_args)
    rows: list[Row] = []
    medians: dict[str, float] = {}
    try:
        asyncio.run(closed_loop(served.port, Row("warm-up"), 16, 32, 3.0, 100_000, False))
        sparse = bool(load_manifest(args.bundle, verify_hashes=False).get("lexical"))
        for name, attack in (("cost", lambda row: cost(served.port, row, args.rounds, args.passages, sparse)),
                             ("rerank+small", lambda row: rerank_and_small(
                                 served.port, row, args.seconds, args.clients, args.passages))):
            print(f"bench.rerank: {name} ...", file=sys.stderr, flush=True)
            row = Row(name)
            row.rss_before_mb = served.rss_mb()
            t0 = time.perf_counter()
            result = asyncio.run(attack(row))
            row.seconds = time.perf_counter() - t0
            row.rss_peak_mb = row.rss_after_mb = served.rss_mb()
            medians = result or medians
            rows.append(row)
    finally:
        served.stop()
    print(table(rows, 0.0))
    if args.json:
        args.json.write_text(json.dumps({
            "workers": args.workers, "passages": args.passages, "rounds": args.rounds,
            "seconds": args.seconds, "clients": args.clients, "cpus": os.cpu_count(),
            "machine": args.machine, "load_average": {"start": load_before, "end": os.getloadavg()[0]},
            "median_ms": medians,
            "rerank_over_embed": medians["/rerank"] / medians["/embed"] if medians else None,
            "sparse_over_embed": medians["/embed_sparse"] / medians["/embed"] if "/embed_sparse" in medians
            else None,
            "hybrid_over_rerank": medians["/rerank hybrid"] / medians["/rerank"]
            if "/rerank hybrid" in medians else None,
            "rows": [r.summary() for r in rows]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
