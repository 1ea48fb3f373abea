"""`bench/gpu.py`'s encoder graphs: which the bundle ships (or the checkpoint exports unchunked),
which the service would load per provider, an ORT session on one of them, and the batcher's cut of
a call. Also the one-line error the bench stops with (no CUDA, missing data).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from disan.runtime.batching import split_by_cells

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


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

    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint
    from model_export.graphs.onnx_files import convert_fp16  # onnx, as above
    from model_export.graphs.wrappers import EncoderGraph, export_graph  # torch + onnx, as above

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
