"""bench.gpu's service part: `disan serve` (workers x request sizes x batching) under a load
generator that is not itself the bottleneck (wrk, else several client processes), with GPU
utilisation and the mean batch beside the rates. See bench/gpu.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from bench.server import Server, load

CUDA = "CUDAExecutionProvider"


def wrk_usable() -> bool:
    """wrk is installed and its binary loads (a copied Debian binary may lack its libraries)."""
    if shutil.which("wrk") is None:
        return False
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    return "wrk" in (out.stdout + out.stderr).lower() and "error" not in out.stderr.lower()


def _client_process(url: str, texts: list[str], concurrency: int, seconds: float, per_request: int):
    import asyncio  # runs in a spawned client process

    from bench.load import run_load

    r = asyncio.run(run_load(url, "/embed", concurrency, 10**9, seconds, per_request, texts))
    return r.sentences_per_s, r.requests_per_s, r.p50_ms, r.p99_ms, r.sent - r.ok


def client_processes(url: str, texts: list[str], connections: int, seconds: float, per_request: int,
                     procs: int) -> dict:
    """Load from `procs` bench.load processes (when wrk is missing). p50: their median; p99:
    the worst process's (an upper bound: the runs' latencies are not merged)."""
    import multiprocessing  # the fallback load generator only
    from concurrent.futures import ProcessPoolExecutor

    per = max(1, connections // procs)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        futures = [pool.submit(_client_process, url, texts, per, seconds, per_request) for _ in range(procs)]
        got = [f.result() for f in futures]
    return {"sentences_per_s": sum(g[0] for g in got), "requests_per_s": sum(g[1] for g in got),
            "p50_ms": float(np.median([g[2] or 0 for g in got])), "p99_ms": max(g[3] or 0 for g in got),
            "non2xx": sum(g[4] for g in got), "tool": f"bench.load x {procs} processes"}


class GpuSampler:
    """Mean GPU utilisation (nvidia-smi, every 0.5 s) while a load runs; None without nvidia-smi."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,"
                                  "nounits"], capture_output=True, text=True, check=False)
            try:
                self.samples.append(float(out.stdout.split()[0]))
            except (IndexError, ValueError):
                return

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return round(float(np.mean(self.samples)), 1) if self.samples else None


def mean_batch(url: str) -> float | None:
    """Mean sentences per encoder call of the worker that answers this scrape (/metrics)."""
    import urllib.request  # loopback only, as every request here

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        for key in ("disan_batch_size_sum", "disan_batch_size_count"):
            if line.startswith(key + '{graph="encoder"}'):
                values[key] = float(line.split()[-1])
    count = values.get("disan_batch_size_count")
    return round(values["disan_batch_size_sum"] / count, 1) if count else None


def service_configs(args: argparse.Namespace) -> list[tuple[str, int, dict]]:
    """(label, workers, DISAN_* settings) of every server: auto budgets with per-worker runtimes
    for each of --workers and the CPU-sized budgets (the defaults before issue 17) for each of
    --cpu-sized-workers."""
    out = [("auto batching", w, {}) for w in args.workers]
    cpu_sized = {"max_batch_size": 64, "max_batch_cells": 4096}
    return out + [("64 / 4096 batching", w, cpu_sized) for w in args.cpu_sized_workers]


def service(args: argparse.Namespace, provider: str, sentences: list[str]) -> dict:
    """Every server config x request size under load; see the module docstring."""
    bodies: dict[int, Path] = {}
    for k in args.texts_per_request:
        bodies[k] = Path(tempfile.mkstemp(suffix=f".{k}.jsonl")[1])
        bodies[k].write_text("".join(json.dumps({"texts": sentences[i:i + k]}) + "\n"
                                     for i in range(0, len(sentences) - k + 1, k)))
    use_wrk = wrk_usable() and not args.client_processes
    wrk_threads = max(1, min(4, (os.cpu_count() or 1) // 4))
    runs = []
    try:
        for label, workers, settings in service_configs(args):
            extra = {"providers": "cuda" if provider == CUDA else "cpu", "workers": workers, **settings}
            with Server(args.bundle, **extra) as server:
                for k, path in bodies.items():
                    load(server.url, path, min(args.connections, 8), 1.0, k)  # warm-up
                    with GpuSampler() as gpu:
                        if use_wrk:
                            stats = load(server.url, path, args.connections, args.seconds, k, wrk_threads)
                        else:
                            stats = client_processes(server.url, sentences, args.connections, args.seconds,
                                                     k, args.client_processes or 4)
                    row = {"config": label, "workers": workers, "texts_per_request": k,
                           "connections": args.connections,
                           "sentences_per_s": round(stats["sentences_per_s"], 1),
                           "requests_per_s": round(stats["sentences_per_s"] / k, 1),
                           "p50_ms": round(stats["p50_ms"], 1), "p99_ms": round(stats["p99_ms"], 1),
                           "non2xx": stats["non2xx"], "tool": stats.get("tool", "wrk"),
                           "gpu_util_pct": gpu.mean, "mean_batch_one_worker": mean_batch(server.url)}
                    runs.append(row)
                    print(f"service {label}, {workers} workers, {k} texts/request: "
                          f"{row['sentences_per_s']:.0f} sentences/s ({row['requests_per_s']:.0f} req/s), "
                          f"p99 {row['p99_ms']} ms, GPU {row['gpu_util_pct'] or '-'} %, mean batch "
                          f"{row['mean_batch_one_worker']}", flush=True)
    finally:
        for path in bodies.values():
            path.unlink()
    return {"connections": args.connections, "runs": runs}
