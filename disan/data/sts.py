"""Unsupervised semantic textual similarity (`disan eval --sts`): Spearman of the cosine of two
sentences' vectors against the human score, on STS Benchmark dev and SICK dev (their test splits
are kept aside, unstaged). No training: this is how a user of `/embed` meets the vectors.

The runner that compares the bundle, students and baselines is `disan/eval/sts_run.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from disan.data.readers import read_jsonl

Encoder = Callable[[list[str]], np.ndarray]

# name -> (staged file, first sentence field, second, score field)
STS_SETS = {
    "STS-B dev": ("stsb/dev.jsonl.gz", "sentence1", "sentence2", "score"),
    "SICK dev": ("senteval/SICK/sick_dev.jsonl.gz", "sentence_a", "sentence_b", "relatedness"),
    "STS other": ("sts-other/dev.jsonl.gz", "sentence1", "sentence2", "score"),
}
# Scored only where staged (`disan eval --sts` without it still scores the others).
OPTIONAL_SETS = ("STS other",)
# Sets whose rows name their genre (STS-B: captions, news, forums), scored per genre as well by
# `disan eval --sts`: one number hides where a student trails.
GENRE_FIELDS = {"STS-B dev": "genre"}
# Sets of several SemEval subsets: scored per subset (`year` and `subset` of each row), the set's
# number being the mean over its subsets, as SemEval and the staged README score them.
SUBSET_FIELDS = {"STS other": ("year", "subset")}
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
    rows = read_jsonl(path)
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


def pair_cosines(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The cosine of each row of `left` with the same row of `right` (a zero row: 0)."""
    left = left / np.maximum(np.linalg.norm(left, axis=1, keepdims=True), 1e-12)
    right = right / np.maximum(np.linalg.norm(right, axis=1, keepdims=True), 1e-12)
    return (left * right).sum(axis=1)


def cosine_spearman(left: np.ndarray, right: np.ndarray, gold: np.ndarray) -> float:
    from scipy.stats import spearmanr  # optional (`train` extra, with scikit-learn)

    return float(spearmanr(pair_cosines(left, right), gold).statistic)


def subsets_of(data: Path, name: str) -> np.ndarray:
    """Each pair's subset ("2012 OnWN") of a set in `SUBSET_FIELDS`, in the file's order."""
    rows = read_jsonl(data / STS_SETS[name][0])
    return np.array([" ".join(str(r[f]) for f in SUBSET_FIELDS[name]) for r in rows])


def sts_scores(encode: Encoder, data: Path, sets: list[str] | None = None,
               by_genre: bool = False) -> dict[str, float]:
    """{set name: cosine Spearman} of `encode` on each STS set (default: every staged one); with
    `by_genre`, also {"SET: GENRE": ...} for the sets of `GENRE_FIELDS` and `SUBSET_FIELDS`, from the
    same vectors. Unrounded: two
    encoders can differ in the fifth decimal, and a goal can hang on that; tables round."""
    scores = {}
    if sets is None:
        sets = [n for n in STS_SETS if n not in OPTIONAL_SETS or (data / STS_SETS[n][0]).is_file()]
    for name in sets:
        a, b, gold = read_pairs(data, name)
        vecs = np.asarray(encode(a + b), dtype=np.float32)
        left, right = vecs[: len(a)], vecs[len(a):]
        if name in SUBSET_FIELDS:
            subsets = subsets_of(data, name)
            each = {f"{name}: {sub}": cosine_spearman(left[subsets == sub], right[subsets == sub],
                                                      gold[subsets == sub]) for sub in sorted(set(subsets))}
            scores[name] = float(np.mean(list(each.values())))
            if by_genre:
                scores.update(each)
            continue
        scores[name] = cosine_spearman(left, right, gold)
        if by_genre and name in GENRE_FIELDS:
            genres = np.array([r[GENRE_FIELDS[name]] for r in read_jsonl(data / STS_SETS[name][0])])
            for genre in sorted(set(genres)):
                rows = genres == genre
                scores[f"{name}: {genre}"] = cosine_spearman(left[rows], right[rows], gold[rows])
    return scores
