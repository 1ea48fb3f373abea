"""`bench/gpu.py --parts sweep`: max_batch_size x max_batch_cells per provider, on sentences
arriving in random order and cut the way the micro-batcher cuts them; the best point per provider.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.gpu_graphs import CPU, CUDA, Encoder, OrtEncoder, served_encoder, sorted_calls

SWEEP_SIZES = [64, 128, 256, 512, 1024]
SWEEP_CELLS = [4096, 1 << 16, 1 << 18, 1 << 20, 1 << 22]


def sweep(args: argparse.Namespace, providers: list[str], encoders: list[Encoder],
          rows: list[list[int]]) -> dict:
    """Sentences/s and p99 call latency per (max_batch_size, max_batch_cells), best per provider.

    Sentences arrive in random order; each window of max_batch_size is what the batcher holds
    when that many are queued, length-sorted and split by cells. Ties (within 3%) go to the
    smaller budget: same throughput, lower latency and memory.
    """
    sizes = [8, 32] if args.smoke else SWEEP_SIZES
    cells_list = [256, 4096] if args.smoke else SWEEP_CELLS
    rng = np.random.default_rng(0)
    out: dict = {}
    for provider in providers:
        enc = served_encoder(encoders, provider)
        # CPU: one single-threaded call per core is the service's layout; time one such call
        sample = rows if provider == CUDA else rows[: args.cpu_sentences]
        run = OrtEncoder(enc.path, provider, 1 if provider == CPU else args.threads)
        arrival = [sample[i] for i in rng.permutation(len(sample))]
        points = []
        for size in sizes:
            for cells in cells_list:
                calls: list[list[list[int]]] = []
                for start in range(0, len(arrival), size):
                    window = arrival[start:start + size]
                    calls += [[window[i] for i in c] for c in sorted_calls(window, size, cells)]
                for c in calls[:3]:
                    run(c)
                times = []
                t0 = time.perf_counter()
                for c in calls:
                    t = time.perf_counter()
                    run(c)
                    times.append(time.perf_counter() - t)
                rate = len(arrival) / (time.perf_counter() - t0)
                points.append({"max_batch_size": size, "max_batch_cells": cells,
                               "sentences_per_s": round(rate, 1),
                               "p99_call_ms": round(1000 * float(np.percentile(times, 99)), 2),
                               "mean_call_sentences": round(len(arrival) / len(calls), 1)})
                print(f"sweep {provider.removesuffix('ExecutionProvider')} {size:>5} x {cells:<8}: "
                      f"{rate:10.1f} sentences/s, p99 call {points[-1]['p99_call_ms']} ms", flush=True)
        top = max(p["sentences_per_s"] for p in points)
        near = [p for p in points if p["sentences_per_s"] >= 0.97 * top]
        best = min(near, key=lambda p: (p["max_batch_cells"], p["max_batch_size"]))
        out[provider] = {"encoder": enc.label, "sentences": len(arrival), "points": points, "best": best}
        print(f"best on {provider}: max_batch_size={best['max_batch_size']} "
              f"max_batch_cells={best['max_batch_cells']} ({best['sentences_per_s']} sentences/s; "
              f"{enc.label})", flush=True)
    return out
