"""Packed vs per-block attention: the same encoder exported both ways, timed in onnxruntime.

    python -m bench.packing --checkpoint runs/nli/best.pt [--threads 2] [--json bench/packing.json]

`DiSANEncoder.packed` computes both directional blocks in one [B,n,n,d] tensor (the forward
mask's lower triangle and the backward mask's upper triangle); switching it off gives the
per-block path (two tensors, each half masked). Both graphs come from the same checkpoint, are
timed alternately in one process (best of --repeats), and their outputs are compared.
Shapes: the batch sizes the service's default cell budget (4096) gives at each length, plus
batch 32 for reference.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.report import run_and_report

SHAPES = [(64, 8), (16, 16), (6, 25), (32, 16), (32, 25), (1, 48), (1, 100)]


def export_both(checkpoint: Path, out_dir: Path) -> dict[str, Path]:
    """Export the checkpoint's encoder with packed on and off -> {"packed": path, "per-block": path}."""
    from disan.checkpoint import load_checkpoint, model_from_checkpoint
    from model_export.graphs import EncoderGraph, export_graph

    model, _, _ = model_from_checkpoint(load_checkpoint(checkpoint))
    encoder = (model.encoder if hasattr(model, "encoder") else model).eval()
    paths = {}
    for name, packed in (("packed", True), ("per-block", False)):
        encoder.packed = packed
        paths[name] = export_graph(EncoderGraph(encoder), out_dir / f"{name}.onnx", encoder.cfg.vocab_size)
    return paths


def run_packing(args: argparse.Namespace) -> dict:
    """Time both graphs on every shape; returns the results dict (also written as JSON)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    rng = np.random.default_rng(0)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "threads": args.threads, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {name: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                    for name, p in export_both(args.checkpoint, Path(tmp)).items()}
        for batch, n in SHAPES:
            feeds = {"ids": rng.integers(2, 1000, (batch, n)).astype(np.int64),
                     "mask": np.ones((batch, n), dtype=bool)}
            outs = {name: s.run(None, feeds)[0] for name, s in sessions.items()}  # also warm-up
            best = dict.fromkeys(sessions, float("inf"))
            for _ in range(args.repeats):
                for name, s in sessions.items():
                    t = time.perf_counter()
                    s.run(None, feeds)
                    best[name] = min(best[name], time.perf_counter() - t)
            row = {f"{name}_ms": round(1000 * t, 3) for name, t in best.items()}
            row["speedup"] = round(best["per-block"] / best["packed"], 3)
            row["max_abs_diff"] = float(np.abs(outs["packed"] - outs["per-block"]).max())
            results["shapes"][f"{batch}x{n}"] = row
            print(f"batch {batch:3d} x {n:3d} tokens: packed {row['packed_ms']:8.2f} ms, per-block "
                  f"{row['per-block_ms']:8.2f} ms, speedup {row['speedup']:.2f}, "
                  f"max |diff| {row['max_abs_diff']:.1e}", flush=True)
    return results


def markdown(results: dict) -> str:
    """Shape x (packed, per-block) table with the speedup and the largest output difference."""
    lines = ["| batch x tokens | packed ms | per-block ms | speedup | max abs diff |",
             "|---|---|---|---|---|"]
    for shape, r in results["shapes"].items():
        lines.append(f"| {shape} | {r['packed_ms']:.2f} | {r['per-block_ms']:.2f} | {r['speedup']:.2f} | "
                     f"{r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="NLI or sentiment checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=Path("bench/packing.json"))
    return run_and_report(parser, run_packing, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
