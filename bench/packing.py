"""Per-block vs packed vs query-chunked attention: one encoder exported each way, timed in ORT.

    python -m bench.packing --checkpoint runs/nli/best.pt [--threads 2] [--chunk-cells 256 512 ...]

`DiSANEncoder.packed` computes both directional blocks in one [B,n,n,d] tensor (the forward
mask's lower triangle and the backward mask's upper triangle); switching it off gives the
per-block path (two tensors, each half masked). `DiSANEncoder.chunk_cells` = N computes the
packed tensor in query-row chunks of about N (batch x rows x tokens) pairs, an ONNX Scan (what
`disan export` ships, N = model_export.graphs.wrappers.ATTENTION_CHUNK_CELLS). All graphs come from the
same checkpoint, are timed alternately in one process (best of --repeats), and their outputs
are compared with the per-block graph's.
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

SHAPES = [(64, 8), (16, 16), (6, 25), (4, 32), (32, 16), (1, 48), (2, 64), (1, 100), (1, 128)]


def export_variants(checkpoint: Path, out_dir: Path, chunk_cells: list[int]) -> dict[str, Path]:
    """Export the checkpoint's encoder per-block, packed, and packed in chunks -> {name: path}."""
    # torch and the exporter load only when there is something to export (`--help` stays fast)
    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint
    from model_export.graphs.wrappers import EncoderGraph, export_graph  # see above

    model, _, _ = model_from_checkpoint(load_checkpoint(checkpoint))
    encoder = (model.encoder if hasattr(model, "encoder") else model).eval()
    paths = {}
    for name, packed, cells in [("per-block", False, 0), ("packed", True, 0),
                                *[(f"chunks {c}", True, c) for c in chunk_cells]]:
        encoder.packed, encoder.chunk_cells = packed, cells
        paths[name] = export_graph(EncoderGraph(encoder), out_dir / f"{name.replace(' ', '_')}.onnx",
                                   encoder.cfg.vocab_size)
    return paths


def run_packing(args: argparse.Namespace) -> dict:
    """Time every graph on every shape; returns the results dict (also written as JSON)."""
    import onnxruntime as ort  # after the export above (see export_variants)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    rng = np.random.default_rng(0)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "threads": args.threads, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {name: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                    for name, p in export_variants(args.checkpoint, Path(tmp), args.chunk_cells).items()}
        for batch, n in SHAPES:
            feeds = {"ids": rng.integers(2, 1000, (batch, n)).astype(np.int64),
                     "mask": np.ones((batch, n), dtype=bool)}
            feeds["mask"][0, n // 2 + 1:] = False  # one padded row
            outs = {name: s.run(None, feeds)[0] for name, s in sessions.items()}  # also warm-up
            best = dict.fromkeys(sessions, float("inf"))
            for _ in range(args.repeats):
                for name, s in sessions.items():
                    t = time.perf_counter()
                    s.run(None, feeds)
                    best[name] = min(best[name], time.perf_counter() - t)
            row = {"ms": {name: round(1000 * t, 3) for name, t in best.items()},
                   "max_abs_diff": float(max(np.abs(o - outs["per-block"]).max() for o in outs.values()))}
            results["shapes"][f"{batch}x{n}"] = row
            timings = ", ".join(f"{k} {v:.2f} ms" for k, v in row["ms"].items())
            print(f"batch {batch:3d} x {n:3d} tokens: {timings}; max |diff| {row['max_abs_diff']:.1e}",
                  flush=True)
    return results


def markdown(results: dict) -> str:
    """Shape x variant table (ms), speedups over the unchunked packed graph, output difference."""
    names = list(next(iter(results["shapes"].values()))["ms"])
    lines = ["| batch x tokens | " + " | ".join(f"{n} ms" for n in names) + " | max abs diff |",
             "|---" * (len(names) + 2) + "|"]
    for shape, r in results["shapes"].items():
        packed = r["ms"]["packed"]
        cells = [f"{r['ms'][n]:.2f}" + (f" ({packed / r['ms'][n]:.2f}x)" if n.startswith("chunks") else "")
                 for n in names]
        lines.append(f"| {shape} | " + " | ".join(cells) + f" | {r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="NLI or sentiment checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--chunk-cells", type=int, nargs="*", default=[256, 512, 1024, 4096],
                        help="query-chunk budgets to export and time (pairs per scan step)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/packing.json"))
    return run_and_report(parser, run_packing, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
