"""Shorter vectors for a bundle whose encoder serves only its whole size (`dimensions`).

Why: `dimensions` (OpenAI's, TEI's, `/embed`'s, `Encoder.encode`'s) makes smaller indexes. A
student trained with Matryoshka prefixes serves them as they are; one that was not (the shipped
encoder serves the teacher's coordinates) loses much at a plain prefix. Its vector is a linear
map of DiSAN's 2*d_h sentence vector plus a bias, so it has at most 2*d_h + 1 directions, and the
coordinates on its first principal axes keep nearly all of it (disan.bundle.dimensions).

How: the bundle's normalised `/embed` vectors of the `--texts` (one per line; plain or gzipped;
windows as served), the first max(--sizes) uncentered principal axes of them, stored fp16 in
`dimensions.npy`; the manifest gains `matryoshka_dims` [D, *sizes] and `matryoshka_projection`
(the file, the axes, how many texts and their sha256). Nothing else in the bundle changes: the
graphs, weights and routes are the same (`disan bundle-diff` reports every route the same).
Pick texts like the ones the bundle will embed, none from the sets you evaluate it on.

    python -m model_export.dimensions models/default --texts fit.txt --sizes 256 128
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from disan.bundle.dimensions import PROJECTION_FILE, principal_axes
from disan.bundle.manifest import BundleError, read_manifest_json, write_manifest
from disan.data.readers import open_text


def read_texts(paths: list[Path], limit: int | None = None, every: int = 1) -> list[str]:
    """Distinct non-empty lines of `paths`, in order, every `every`-th of them, at most `limit`."""
    if every < 1:
        raise ValueError(f"every {every}: at least 1")
    met: set[str] = set()
    kept: list[str] = []
    for path in paths:
        with open_text(path) as lines:
            for line in lines:
                if not (text := line.strip()) or text in met:
                    continue
                met.add(text)
                if (len(met) - 1) % every == 0:
                    kept.append(text)
                    if limit is not None and len(kept) >= limit:
                        return kept
    return kept


def add_dimensions(bundle: Path, texts: list[str], sizes: list[int], threads: int = 0) -> dict:
    """Fit the principal axes on `texts` and write them and the manifest entries (module
    docstring); returns the manifest's new entries."""
    from disan.runtime.encoder import Encoder  # onnxruntime: only this step needs it

    manifest = read_manifest_json(bundle)
    if manifest.get("matryoshka_dims") and not manifest.get("matryoshka_projection"):
        raise BundleError(f"{bundle}: its encoder was trained with Matryoshka prefixes "
                          f"({manifest['matryoshka_dims']}); it serves those sizes already")
    encoder = Encoder(bundle, threads=threads)
    whole = encoder.dim
    sizes = sorted(set(sizes), reverse=True)
    if not sizes or not all(1 <= m < whole for m in sizes):
        raise ValueError(f"--sizes {sizes}: each from 1 to {whole - 1} (the whole vector is {whole})")
    if len(texts) < sizes[0]:
        raise ValueError(f"{len(texts)} texts: at least as many as the largest size ({sizes[0]}) are needed")
    vectors = encoder.encode(texts, normalize=True)
    axes = principal_axes(vectors, sizes[0]).astype(np.float16)
    np.save(bundle / PROJECTION_FILE, axes, allow_pickle=False)
    digest = hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()
    entries = {"matryoshka_dims": [whole, *sizes],
               "matryoshka_projection": {"file": PROJECTION_FILE, "axes": sizes[0], "storage": "fp16",
                                         "fit_texts": len(texts), "fit_sha256": digest}}
    write_manifest(bundle, {**manifest, **entries})
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export.dimensions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--texts", type=Path, nargs="+", required=True,
                        help="files of texts, one per line (.gz too), like those the bundle will embed")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 128],
                        help="the shorter sizes to serve (default: 256 128)")
    parser.add_argument("--max-texts", type=int, default=None, help="use at most this many texts")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        texts = read_texts(args.texts, args.max_texts)
        entries = add_dimensions(args.bundle, texts, args.sizes, args.threads)
    except ValueError as exc:  # BundleError too
        print(f"dimensions: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.bundle}: dimensions {entries['matryoshka_dims']} from {len(texts)} texts "
          f"({entries['matryoshka_projection']['file']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
