"""Does post-processing the served vectors raise unsupervised STS? (docs/distillation.md)

Centering, removing the top principal directions and whitening (BERT-whitening style) are linear
maps, so any that helped could be folded into the encoder's projection. Their statistics come from
training text only (STS-B and SICK train sentences, MultiNLI dev premises); the scores are the
cosine Spearman of `disan eval --sts` on STS-B dev and SICK dev.

    python -m research.analyses.sts_postprocess --bundle models/default --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from disan import Encoder
from disan.data.readers import read_jsonl
from disan.data.sts import STS_SETS, cosine_spearman, read_pairs, train_pairs

MNLI_PREMISES = 5000


def reference_sentences(data: Path) -> list[str]:
    """Training sentences only: the labelled STS train pairs and MultiNLI dev premises."""
    left, right, _ = train_pairs(data)
    ref = sorted(set(left + right))
    ref += [row["sentence1"] for row in read_jsonl(data / "mnli/dev_matched.jsonl.gz")[:MNLI_PREMISES]]
    return ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default="models/default")
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    try:  # a wrong --bundle or --data ends in one line, not a traceback
        encoder = Encoder(args.bundle)
        pairs = {name: read_pairs(args.data, name) for name in STS_SETS}
        reference = reference_sentences(args.data)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"sts_postprocess: {exc}") from None

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(encoder.encode(texts), dtype=np.float64)

    dev = {}
    for name, (a, b, gold) in pairs.items():
        vecs = encode(a + b)
        dev[name] = (vecs[: len(a)], vecs[len(a):], gold)
    ref = encode(reference)
    mean = ref.mean(axis=0)
    eigvecs, eigvals, _ = np.linalg.svd(np.cov((ref - mean).T))
    dim = ref.shape[1]

    maps = {"as served": lambda x: x, "mean subtracted": lambda x: x - mean}
    for k in (1, 2, 4, 8):
        top = eigvecs[:, :k]
        maps[f"top {k} principal directions removed"] = lambda x, p=np.eye(dim) - top @ top.T: (x - mean) @ p
    for k in (dim, 512, 384, 256):
        maps[f"whitened to {k} dims"] = lambda x, w=eigvecs[:, :k] / np.sqrt(eigvals[:k]): (x - mean) @ w

    rows = {}
    for label, f in maps.items():
        rows[label] = {name: round(cosine_spearman(f(a), f(b), gold), 4)
                       for name, (a, b, gold) in dev.items()}
        print(f"{label:40s}", json.dumps(rows[label]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"reference_sentences": len(ref), "scores": rows}, indent=2) + "\n")


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.sts_postprocess"))
