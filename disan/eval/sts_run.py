"""`disan eval --sts`: the bundle (or students before export) and the MiniLM-L6 / MPNet baselines
scored on every STS set in one run, so their rows can be compared. Kept apart from `disan/data/sts.py`
because the student encoder comes from `disan/distill/loop.py`, which trains on `disan/data/sts.py`'s pairs.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from disan.bundle.dimensions import bundle_projection, require_within_the_axes, shorten
from disan.data.sts import sts_scores


def remembered(encode):
    """`encode` that embeds each distinct text once, so each Matryoshka size reads the same vectors."""
    memo: dict[str, np.ndarray] = {}

    def run(texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in memo]
        if missing:
            memo.update(zip(missing, np.asarray(encode(missing), dtype=np.float32), strict=True))
        return np.stack([memo[t] for t in texts])

    return run


def run_sts(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Bundle (or --checkpoint students) + baselines on every STS set; markdown table and JSON in
    --out-dir."""
    from disan.eval.transfer import (  # scikit-learn (`train`)
        add_baselines,
        encoders_under_test,
        minilm_encoder,
        mpnet_encoder,
        wordllama_encoder,
    )

    bundle_label = f"DiSAN ({args.bundle})"
    encoders = encoders_under_test(args.checkpoint, args.bundle, bundle_label)
    named = {"minilm": ("all-MiniLM-L6-v2", minilm_encoder), "mpnet": ("all-mpnet-base-v2", mpnet_encoder),
             "wordllama": ("WordLlama 256-d (static)", wordllama_encoder)}
    add_baselines(encoders, args.sts_baselines, named, "--sts-baselines")
    sizes = getattr(args, "dimensions", None) or ()
    # the bundle's `dimensions=m` (disan.bundle.dimensions); checkpoints and baselines: prefixes
    projection = bundle_projection(args.bundle) if sizes and args.bundle and not args.checkpoint else None
    require_within_the_axes(sizes, projection, args.bundle)
    results = {}
    for label, make in encoders.items():
        encode = remembered(make()) if sizes else make()
        results[label] = sts_scores(encode, args.data, by_genre=True)
        width = len(encode(["a"])[0]) if sizes else 0
        axes = projection if label == bundle_label else None
        for m in (m for m in sizes if 0 < m < width):  # a size as served: m components, renormalised
            def cut(texts: list[str], m: int = m, encode=encode, axes=axes):
                return shorten(encode(texts), m, axes)

            results[f"{label}, {m} dims"] = sts_scores(cut, args.data, by_genre=True)
    columns = list(next(iter(results.values())))  # the sets, then STS-B dev by genre
    lines = ["| cosine Spearman | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    lines += [f"| {label} | " + " | ".join(f"{s[n]:.4f}" for n in columns) + " |"
              for label, s in results.items()]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "sts.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (args.out_dir / "sts.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return results
