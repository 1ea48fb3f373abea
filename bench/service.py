"""Service benchmark: throughput and latency of `disan serve` on loopback vs offline ORT (one run).

    python -m bench.service --bundle models/default --data ../shared/data [--seconds 10] [--json OUT]

For concurrency 1, 8 and 64 it measures POST /embed (one SNLI-length sentence per request) against
servers with: the default settings (one process keeping one single-threaded ORT call per core in
flight); one process making one call at a time with --threads ORT threads; one worker process per
core with one ORT thread each, with and without the fast path; batching disabled
(DISAN_MAX_BATCH_SIZE=1, one call with --threads threads); and --texts-per-request sentences per
request (how much of the gap is per-request HTTP cost). Each is reported as a ratio to two
offline ORT references measured in the same run on the same sentences (length-sorted, cut the
way the batcher cuts): one process with --threads threads (the offline table's setting), and
one single-threaded process per core running at once (the most the machine does offline). Load
comes from `wrk` (Debian package wrk; bounded by --seconds) when installed, else from bench.load
(Python, slower: it shares the CPU with the server). It also records the server's peak RSS after
the largest allowed request.
Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.report import run_and_report

WRK_SCRIPT = """
local bodies = {}
for line in io.lines("%s") do bodies[#bodies + 1] = line end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i %% #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
done = function(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests": %%d, "seconds": %%f, "errors": %%d, "non2xx": %%d, '
    .. '"p50_ms": %%f, "p95_ms": %%f, "p99_ms": %%f}\\n', summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50) / 1e3, latency:percentile(95) / 1e3,
    latency:percentile(99) / 1e3))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`disan serve` (or `command`, which must read the same DISAN_* variables) in a subprocess on
    127.0.0.1 with extra DISAN_* settings; ready when /ready says 200."""

    def __init__(self, bundle: Path, command: list[str] | None = None, **settings: object):
        self.port = free_port()
        env = {**os.environ, **{f"DISAN_{k.upper()}": str(v) for k, v in settings.items()}}
        env.update(
            DISAN_BUNDLE=str(bundle),
            DISAN_HOST="127.0.0.1",
            DISAN_PORT=str(self.port),
            DISAN_LOG_LEVEL="warning",
        )
        self.proc = subprocess.Popen(command or [sys.executable, "-m", "disan.cli", "serve"], env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("server did not become ready in 120 s")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def post(self, path: str, body: dict) -> int:
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load(url: str, bodies_file: Path, concurrency: int, seconds: float, per_request: int = 1) -> dict:
    """Throughput and latency of POST /embed at `concurrency` for `seconds` (`per_request`
    sentences in each body)."""
    if shutil.which("wrk"):
        script = Path(tempfile.mkstemp(suffix=".lua")[1])
        script.write_text(WRK_SCRIPT % bodies_file)
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{concurrency}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "30s",
                "-s",
                str(script),
                url + "/embed",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        script.unlink()
        stats = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON"))[8:])
        stats["sentences_per_s"] = per_request * (stats["requests"] - stats["non2xx"]) / stats["seconds"]
        stats["tool"] = "wrk"
        return stats
    import asyncio

    from bench.load import run_load

    texts = [t for b in bodies_file.read_text().splitlines() for t in json.loads(b)["texts"]]
    res = asyncio.run(run_load(url, "/embed", concurrency, 10**6, seconds, per_request, texts))
    return {
        "sentences_per_s": res.sentences_per_s,
        "p50_ms": res.p50_ms,
        "p95_ms": res.p95_ms,
        "p99_ms": res.p99_ms,
        "requests": res.sent,
        "non2xx": res.sent - res.ok,
        "tool": "bench.load",
    }


def _offline_worker(bundle: Path, sentences: list[str], batch: int, cells: int, barrier,
                    seconds: float) -> float:
    """One single-threaded ORT process: sentences/s over `seconds`, started with its siblings."""
    from bench.offline import length_batches, ort_encoder
    from disan.evaluate import load_runtime

    encode = ort_encoder(load_runtime(bundle, threads=1))
    batches = length_batches(sentences, batch, cells)
    encode(batches[0])  # warm-up
    barrier.wait()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for b in batches:
            encode(b)
            done += len(b)
    return done / (time.perf_counter() - t0)


def offline_parallel(bundle: Path, sentences: list[str], procs: int, batch: int, cells: int,
                     seconds: float = 8.0) -> float:
    """Sentences/s of `procs` single-threaded ORT processes running at once (summed): the most
    the machine does offline when every core runs its own call."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        barrier = manager.Barrier(procs)
        futures = [pool.submit(_offline_worker, bundle, sentences, batch, cells, barrier, seconds)
                   for _ in range(procs)]
        return sum(f.result() for f in futures)


def server_configs(args: argparse.Namespace) -> list[tuple[str, dict, list[int]]]:
    """(label, DISAN_* settings, texts-per-request values) of every server measured."""
    cores = os.cpu_count() or 1
    many = [1, args.texts_per_request] if args.texts_per_request > 1 else [1]
    return [
        # defaults: on CPU one single-threaded ORT call per core in flight, one process
        ("batching", {}, many),
        (f"batching, 1 call x {args.threads} threads", {"intra_op_threads": args.threads,
                                                         "batch_concurrency": 1}, [1]),
        # one process per core: one's HTTP/JSON work overlaps the other's inference
        (f"batching, {cores} workers x 1 thread", {"workers": cores, "intra_op_threads": 1}, many),
        (f"batching, {cores} workers x 1 thread, fast path off",
         {"workers": cores, "intra_op_threads": 1, "fast_path": False}, [1]),
        ("no batching", {"intra_op_threads": args.threads, "batch_concurrency": 1, "max_batch_size": 1},
         [1]),
    ]


def run_service_bench(args: argparse.Namespace) -> dict:
    """All service measurements plus the offline ORT references, in one run."""
    from bench.offline import load_sentences, ort_encoder, throughput
    from disan.evaluate import load_runtime

    sentences = load_sentences(args.data, args.sentences)["11-25"]  # SNLI-length sentences
    offline = throughput(ort_encoder(load_runtime(args.bundle, threads=args.threads)), sentences,
                         args.max_batch_size, 3, args.max_cells)
    cores = os.cpu_count() or 1
    parallel = offline_parallel(args.bundle, sentences, cores, args.max_batch_size, args.max_cells)
    bodies: dict[int, Path] = {}
    for k in sorted({1, args.texts_per_request}):
        bodies[k] = Path(tempfile.mkstemp(suffix=f".{k}.jsonl")[1])
        bodies[k].write_text("".join(json.dumps({"texts": sentences[i : i + k]}) + "\n"
                                     for i in range(0, len(sentences) - k + 1, k)))
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cores} cores",
        "offline_ort_sentences_per_s": round(offline, 1),
        "offline_parallel_sentences_per_s": round(parallel, 1),
        "parallel_processes": cores,
        "threads": args.threads,
        "offline_batching": {"max_batch_size": args.max_batch_size, "max_cells": args.max_cells},
        "runs": {},
    }
    print(f"offline ORT fp32: {offline:.0f} sentences/s ({args.threads} threads); "
          f"{cores} processes x 1 thread: {parallel:.0f}", flush=True)
    for name, extra, per_request in server_configs(args):
        with Server(args.bundle, **extra) as server:
            for k in per_request:
                for c in args.concurrency:
                    if k > 1 and c == 1:
                        continue
                    stats = load(server.url, bodies[k], c, args.seconds, k)
                    stats["texts_per_request"] = k
                    stats["ratio_to_offline"] = round(stats["sentences_per_s"] / offline, 3)
                    stats["ratio_to_parallel"] = round(stats["sentences_per_s"] / parallel, 3)
                    label = name if k == 1 else f"{name}, {k} texts/request"
                    results["runs"][f"{label} c={c}"] = stats
                    print(
                        f"{label:>48} c={c:>3}: {stats['sentences_per_s']:7.1f} sent/s "
                        f"(x{stats['ratio_to_offline']:.2f} offline), p50 {stats['p50_ms']:.1f} ms, "
                        f"p99 {stats['p99_ms']:.1f} ms, non-2xx {stats['non2xx']}",
                        flush=True,
                    )
            if name == "batching":
                # Largest allowed request: max texts, each max_tokens words long.
                long_text = " ".join(["word"] * 128)
                before = server.peak_rss_mb()
                status = server.post("/embed", {"texts": [long_text] * 256, "truncate": True})
                results["peak_rss_mb"] = {
                    "after_warmup": round(before, 1),
                    "after_largest_request": round(server.peak_rss_mb(), 1),
                    "request": "256 texts x 128 tokens",
                    "status": status,
                }
                print(f"peak RSS {before:.0f} MB -> {server.peak_rss_mb():.0f} MB after 256 x 128 tokens")
    for path in bodies.values():
        path.unlink()
    return results


def markdown(results: dict) -> str:
    """Table of the load runs, each with its ratio to both offline ORT references."""
    procs = results["parallel_processes"]
    lines = [
        f"Offline ORT fp32 on the same bundle and sentences, length-sorted and cut like the batcher "
        f"({results['offline_batching']['max_batch_size']} sentences / "
        f"{results['offline_batching']['max_cells']} padded cells at most): "
        f"{results['offline_ort_sentences_per_s']:.0f} sentences/s in one process with "
        f"{results['threads']} threads (\"x offline\", the offline table's setting); "
        f"{results['offline_parallel_sentences_per_s']:.0f} sentences/s from {procs} single-threaded "
        f"processes at once (\"x {procs} procs\").",
        "",
        f"| server | concurrency | sentences/s | x offline | x {procs} procs | p50 ms | p95 ms | p99 ms "
        "| non-2xx |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in results["runs"].items():
        server, conc = name.rsplit(" c=", 1)
        lines.append(
            f"| {server} | {conc} | {s['sentences_per_s']:.0f} | {s['ratio_to_offline']:.2f} | "
            f"{s['ratio_to_parallel']:.2f} | {s['p50_ms']:.1f} | {s['p95_ms']:.1f} | {s['p99_ms']:.1f} "
            f"| {s['non2xx']} |"
        )
    rss = results.get("peak_rss_mb")
    if rss:
        lines += [
            "",
            f"Peak RSS: {rss['after_warmup']:.0f} MB after warm-up, {rss['after_largest_request']:.0f} MB "
            f"after the largest allowed request ({rss['request']}, HTTP {rss['status']}).",
        ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `python -m bench.service`."""
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    from service.settings import Settings

    defaults = Settings.model_fields
    parser.add_argument("--texts-per-request", type=int, default=8,
                        help="also measure the batching server with this many sentences per request")
    parser.add_argument("--max-batch-size", type=int, default=defaults["max_batch_size"].default,
                        help="offline reference: most sentences per call (default: the service's)")
    parser.add_argument("--max-cells", type=int, default=defaults["max_batch_cells"].default,
                        help="offline reference: padded cells per call (default: the service's)")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=10.0, help="per load run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--json", type=Path, default=Path("bench/service.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_and_report(parser, run_service_bench, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
