"""Server CPU per request with inference stubbed out: what the HTTP layer itself costs.

    python -m bench.overhead --bundle models/default [--seconds 6] [--json OUT]

Starts `disan serve`'s app (one process) with the encoder replaced by a zero-vector stub, drives
POST /embed (one SNLI-length sentence per request) at concurrency 64 (`bench.service.load`: wrk,
else bench.load), and reads the server's CPU time from /proc: CPU microseconds per request, with
the fast path on and off and with uvicorn's access log on (alternating, best of --repeats). Linux
only; only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.offline import load_sentences
from bench.report import run_and_report
from bench.server import Server, load, process_cpu
from disan.runtime.runtime import Runtime
from service.cli import HTTP_PROTOCOL
from service.main import create_app
from service.settings import Settings


def serve_stub() -> None:
    """Run the service with a stub encoder (child process entry point; DISAN_* settings)."""
    import numpy as np  # the child process's own imports (spawned: nothing is inherited)
    import uvicorn


    Runtime.embed = lambda self, ids: np.zeros((len(ids), 600), np.float32)  # no inference
    settings = Settings()
    if settings.access_log:  # the log lines are formatted and written, to /dev/null
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    # uvicorn's options as `disan serve` sets them (service/cli.py).
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level="info" if settings.access_log else "warning",
                access_log=settings.access_log, proxy_headers=False, http=HTTP_PROTOCOL,
                h11_max_incomplete_event_size=settings.max_header_bytes)


# row -> DISAN_* settings of the stub server
CONFIGS = {
    "fast path": {},
    "fast path, access log on": {"access_log": True},
    "FastAPI routing (fast_path=false)": {"fast_path": False},
}


def measure(bundle: Path, settings: dict, bodies: Path, seconds: float) -> dict:
    """Requests/s and server CPU microseconds per request at concurrency 64."""
    command = [sys.executable, "-c", "from bench.overhead import serve_stub; serve_stub()"]
    with Server(bundle, command=command, **settings) as server:
        before = process_cpu(server.proc.pid)
        stats = load(server.url, bodies, 64, seconds)
        used = process_cpu(server.proc.pid) - before
    ok = stats["requests"] - stats["non2xx"]
    return {"requests_per_s": round(stats["sentences_per_s"]), "cpu_us_per_request": round(1e6 * used / ok),
            "non2xx": stats["non2xx"]}


def run_overhead(args: argparse.Namespace) -> dict:
    """Fast path on and off, same stub, same sentences."""

    sentences = load_sentences(args.data, 512)["11-25"]
    bodies = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    bodies.write_text("".join(json.dumps({"texts": [s]}) + "\n" for s in sentences))
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores", "runs": {}}
    for _ in range(args.repeats):
        for name, settings in CONFIGS.items():
            run = measure(args.bundle, settings, bodies, args.seconds)
            best = results["runs"].get(name)
            if best is None or run["cpu_us_per_request"] < best["cpu_us_per_request"]:
                results["runs"][name] = run
            print(name, run, flush=True)
    bodies.unlink()
    return results


def markdown(results: dict) -> str:
    """One row per path: requests/s and server CPU per request (best of the repeats)."""
    lines = ["| request path (encoder stubbed) | requests/s | server CPU µs / request | non-2xx |",
             "|---|---|---|---|"]
    for name, r in results["runs"].items():
        lines.append(f"| {name} | {r['requests_per_s']} | {r['cpu_us_per_request']} | {r['non2xx']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs; best kept")
    parser.add_argument("--json", type=Path, default=Path("bench/results/overhead.json"))
    return run_and_report(parser, run_overhead, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
