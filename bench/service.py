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
(Python, slower: it shares the CPU with the server). For the default server it also splits the
server's CPU per request between its event-loop thread and its onnxruntime threads (/proc), and
records its peak RSS after the largest allowed request.
Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.offline import CPU_BATCHING, length_batches, load_sentences, ort_encoder, throughput
from bench.report import run_and_report
from bench.server import Server, load, thread_cpu
from disan.runtime.runtime import load_offline


def _offline_worker(bundle: Path, sentences: list[str], batch: int, cells: int, barrier,
                    seconds: float) -> float:
    """One single-threaded ORT process: sentences/s over `seconds`, started with its siblings."""

    encode = ort_encoder(load_offline(bundle, threads=1))
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
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        barrier = manager.Barrier(procs)
        futures = [pool.submit(_offline_worker, bundle, sentences, batch, cells, barrier, seconds)
                   for _ in range(procs)]
        return sum(f.result() for f in futures)


def cpu_split(pid: int, before: dict[int, float], after: dict[int, float], stats: dict) -> dict:
    """Server CPU µs per answered request: the event-loop thread (HTTP, JSON, tokenizing,
    batching; its thread id is the pid) and all other threads (the onnxruntime calls)."""
    ok = max(1, stats["requests"] - stats["non2xx"])
    used = {tid: t - before.get(tid, 0.0) for tid, t in after.items()}
    loop = used.pop(pid, 0.0)
    return {"event_loop": round(1e6 * loop / ok), "other_threads": round(1e6 * sum(used.values()) / ok)}


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

    sentences = load_sentences(args.data, args.sentences)["11-25"]  # SNLI-length sentences
    offline = throughput(ort_encoder(load_offline(args.bundle, threads=args.threads)), sentences,
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
                    split = name == "batching" and k == 1  # one process: its threads are the server
                    before = thread_cpu(server.proc.pid) if split else {}
                    stats = load(server.url, bodies[k], c, args.seconds, k)
                    if split:
                        stats["cpu_us_per_request"] = cpu_split(server.proc.pid, before,
                                                                thread_cpu(server.proc.pid), stats)
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
    splits = {name: r["cpu_us_per_request"] for name, r in results["runs"].items()
              if "cpu_us_per_request" in r}
    per_proc = 1e6 * procs / results["offline_parallel_sentences_per_s"]
    if splits:
        lines += ["", "Server CPU per one-sentence request, default server (event loop + onnxruntime "
                  f"threads; offline, one single-threaded process spends {per_proc:.0f} µs per sentence): "
                  + "; ".join(f"c={n.rsplit(' c=', 1)[1]}: {v['event_loop']} + {v['other_threads']} µs"
                              for n, v in splits.items()) + "."]
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

    parser.add_argument("--texts-per-request", type=int, default=8,
                        help="also measure the batching server with this many sentences per request")
    parser.add_argument("--max-batch-size", type=int, default=CPU_BATCHING.max_batch_size,
                        help="offline reference: most sentences per call (default: the service's)")
    parser.add_argument("--max-cells", type=int, default=CPU_BATCHING.max_batch_cells,
                        help="offline reference: padded cells per call (default: the service's)")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=10.0, help="per load run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--json", type=Path, default=Path("bench/results/service.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_and_report(parser, run_service_bench, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
