"""Unsupervised semantic textual similarity (`disan eval --sts`): Spearman of the cosine of two
sentences' vectors against the human score, on STS Benchmark dev and SICK dev (their test splits
are kept aside, unstaged). No training: this is how a user of `/embed` meets the vectors.

Rows of the bundle, MiniLM-L6 and MPNet come from the same run, so they can be compared.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

Encoder = Callable[[list[str]], np.ndarray]

# name -> (staged file, first sentence field, second, score field)
STS_SETS = {
    "STS-B dev": ("stsb/dev.jsonl.gz", "sentence1", "sentence2", "score"),
    "SICK dev": ("senteval/SICK/sick_dev.jsonl.gz", "sentence_a", "sentence_b", "relatedness"),
}
# Labelled training pairs a student may learn from (`disan pretrain --pairs-weight`): name ->
# (file, fields as above, score range), scores mapped to [0, 1].
STS_TRAIN_SETS = {
    "STS-B train": ("stsb/train.jsonl.gz", "sentence1", "sentence2", "score", (0.0, 5.0)),
    "SICK train": ("senteval/SICK/sick_train.jsonl.gz", "sentence_a", "sentence_b", "relatedness",
                   (1.0, 5.0)),
}


def read_pairs(data: Path, name: str) -> tuple[list[str], list[str], np.ndarray]:
    rel, a, b, score = {**STS_SETS, **{k: v[:4] for k, v in STS_TRAIN_SETS.items()}}[name]
    path = data / rel
    if not path.is_file():
        raise ValueError(f"{path}: STS data not found (point --data at the staged data directory)")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [r[a] for r in rows], [r[b] for r in rows], np.array([float(r[score]) for r in rows])


def train_pairs(data: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Every labelled training pair, scores scaled to [0, 1] (never a dev or test pair)."""
    left, right, scores = [], [], []
    for name, (*_, (low, high)) in STS_TRAIN_SETS.items():
        a, b, gold = read_pairs(data, name)
        left += a
        right += b
        scores.append((gold - low) / (high - low))
    return left, right, np.concatenate(scores).astype(np.float32)


def cosine_spearman(left: np.ndarray, right: np.ndarray, gold: np.ndarray) -> float:
    from scipy.stats import spearmanr  # optional (`train` extra, with scikit-learn)

    left = left / np.maximum(np.linalg.norm(left, axis=1, keepdims=True), 1e-12)
    right = right / np.maximum(np.linalg.norm(right, axis=1, keepdims=True), 1e-12)
    return float(spearmanr((left * right).sum(axis=1), gold).statistic)


def sts_scores(encode: Encoder, data: Path, sets: list[str] | None = None) -> dict[str, float]:
    """{set name: cosine Spearman} of `encode` on each STS set."""
    scores = {}
    for name in sets or list(STS_SETS):
        a, b, gold = read_pairs(data, name)
        vecs = np.asarray(encode(a + b), dtype=np.float32)
        scores[name] = round(cosine_spearman(vecs[: len(a)], vecs[len(a):], gold), 4)
    return scores


def mpnet_encoder() -> Encoder:
    """all-mpnet-base-v2 (the teacher; the ceiling a student can reach), fp32."""
    from disan.embeddings import _sentence_encoder  # pulls sentence-transformers (`mpnet` extra)

    model = _sentence_encoder("mpnet")
    return lambda texts: model.encode(texts, batch_size=64, convert_to_numpy=True)


def checkpoint_encoder(path: Path) -> Encoder:
    """Texts -> the served vectors of an `encoder` checkpoint (a student before export), in torch."""
    from disan.distill import checkpoint_encoder as load  # torch (`train` extra)

    return load(path)


def run_sts(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Bundle (or --checkpoint students) + baselines on every STS set; markdown table and JSON in
    --out-dir."""
    from disan.transfer import disan_encoder, minilm_encoder  # scikit-learn (`train` extra)

    encoders: dict[str, Callable[[], Encoder]] = (
        {f"DiSAN checkpoint ({p})": (lambda p=p: checkpoint_encoder(p)) for p in args.checkpoint}
        if args.checkpoint else {f"DiSAN ({args.bundle})": lambda: disan_encoder(args.bundle)})
    named = {"minilm": ("all-MiniLM-L6-v2", minilm_encoder), "mpnet": ("all-mpnet-base-v2", mpnet_encoder)}
    for key in [b for b in args.sts_baselines.split(",") if b]:
        label, make = named[key]
        encoders[label] = make
    results = {label: sts_scores(make(), args.data) for label, make in encoders.items()}
    lines = ["| cosine Spearman | " + " | ".join(STS_SETS) + " |", "| --- |" + " --- |" * len(STS_SETS)]
    lines += [f"| {label} | " + " | ".join(f"{s[n]:.4f}" for n in STS_SETS) + " |"
              for label, s in results.items()]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "sts.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (args.out_dir / "sts.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return results
