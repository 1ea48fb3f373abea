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

`--span` keeps as many axes as the vectors have directions (2*d_h + 1 at most), checks that they
span every fit text's vector (`residual`: the largest part of one outside them, axes as stored)
and marks the projection `spans_the_vector`: every size short of the whole is then served, those
past the axes as the same vector with zeros after it (`--sizes` may name them, e.g. 512).
`--keep-axes` keeps the bundle's stored axes as the first ones and fits only the rest, on what
the texts' vectors have outside them, so the sizes it serves now stay the same vectors; it takes
the texts the stored axes were fitted on (their sha256 must match).

    python -m model_export.dimensions models/default --texts fit.txt --sizes 256 128
    python -m model_export.dimensions models/default --texts fit.txt --sizes 512 256 128 --span --keep-axes
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


# a direction the fit vectors have: singular value above this share of the largest (float32
# vectors put their empty directions near 1e-7 of it)
SPAN_TOLERANCE = 1e-6
# `--span` refuses axes that leave more than this of a fit vector (unit length) outside them
SPAN_RESIDUAL = 1e-2


def add_dimensions(bundle: Path, texts: list[str], sizes: list[int], threads: int = 0, span: bool = False,
                   keep_axes: bool = False) -> dict:
    """Fit the principal axes on `texts` and write them and the manifest entries (module
    docstring); returns the manifest's new entries."""
    from disan.runtime.encoder import Encoder  # onnxruntime: only this step needs it

    manifest = read_manifest_json(bundle)
    if manifest.get("matryoshka_dims") and not manifest.get("matryoshka_projection"):
        raise BundleError(f"{bundle}: its encoder was trained with Matryoshka prefixes "
                          f"({manifest['matryoshka_dims']}); it serves those sizes already")
    digest = hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()
    stored = kept_axes(bundle, manifest, digest) if keep_axes else None
    encoder = Encoder(bundle, threads=threads)
    whole = encoder.dim
    sizes = sorted(set(sizes), reverse=True)
    if not sizes or not all(1 <= m < whole for m in sizes):
        raise ValueError(f"--sizes {sizes}: each from 1 to {whole - 1} (the whole vector is {whole})")
    vectors = encoder.encode(texts, normalize=True).astype(np.float64)
    count = span_of(vectors) if span else sizes[0]
    if span and count >= min(whole, len(texts)):
        raise ValueError(f"the vectors of the {len(texts)} texts have {count} directions: "
                         + ("no size past the axes to serve (drop --span)" if count >= whole else
                            "more texts than the vector has directions are needed to find its span"))
    if not span and len(texts) < count:
        raise ValueError(f"{len(texts)} texts: at least as many as the largest size ({count}) are needed")
    if stored is not None and stored.shape[1] > count:
        raise ValueError(f"--keep-axes: the bundle stores {stored.shape[1]} axes, more than {count}")
    axes = principal_axes(vectors, count) if stored is None else extended(stored, vectors, count)
    axes = axes.astype(np.float16)
    projection = {"file": PROJECTION_FILE, "axes": count, "storage": "fp16",
                  "fit_texts": len(texts), "fit_sha256": digest}
    if span:
        residual = outside(vectors, axes.astype(np.float64))
        if residual > SPAN_RESIDUAL:
            raise ValueError(f"{count} axes leave {residual:.3g} of a fit vector outside them: they do not "
                             f"span the vectors (drop --span)")
        projection.update(spans_the_vector=True, residual=round(residual, 6))
    np.save(bundle / PROJECTION_FILE, axes, allow_pickle=False)
    entries = {"matryoshka_dims": [whole, *sizes], "matryoshka_projection": projection}
    write_manifest(bundle, {**manifest, **entries})
    return entries


def span_of(vectors: np.ndarray) -> int:
    """How many directions `vectors` [N, D] have: singular values above SPAN_TOLERANCE of the largest."""
    values = np.linalg.svd(vectors, compute_uv=False)
    return int((values > SPAN_TOLERANCE * values[0]).sum())


def kept_axes(bundle: Path, manifest: dict, digest: str) -> np.ndarray:
    """The bundle's stored axes (as stored, fp16) for `--keep-axes`, which must have been fitted on
    the texts of sha256 `digest`."""
    entry = manifest.get("matryoshka_projection")
    if not entry:
        raise ValueError(f"--keep-axes: {bundle} has no principal axes to keep")
    if entry.get("fit_sha256") != digest:
        raise ValueError(f"--keep-axes: the stored axes were fitted on other texts (sha256 "
                         f"{entry.get('fit_sha256')}; these are {digest})")
    return np.load(bundle / entry["file"], allow_pickle=False)[:, :int(entry["axes"])]


def extended(stored: np.ndarray, vectors: np.ndarray, count: int) -> np.ndarray:
    """`stored` [D, K0] followed by the first count - K0 principal axes of the part of `vectors`
    outside their span (each new axis orthogonal to every stored one)."""
    if count == stored.shape[1]:
        return stored.astype(np.float64)
    basis = np.linalg.qr(stored.astype(np.float64))[0]
    rest = vectors - (vectors @ basis) @ basis.T
    return np.concatenate([stored.astype(np.float64), principal_axes(rest, count - stored.shape[1])], axis=1)


def outside(vectors: np.ndarray, axes: np.ndarray) -> float:
    """The largest norm of a row of `vectors` outside the span of `axes` [D, K]."""
    basis = np.linalg.qr(axes)[0]
    return float(np.linalg.norm(vectors - (vectors @ basis) @ basis.T, axis=1).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export.dimensions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--texts", type=Path, nargs="+", required=True,
                        help="files of texts, one per line (.gz too), like those the bundle will embed")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 128],
                        help="the shorter sizes to serve (default: 256 128)")
    parser.add_argument("--span", action="store_true",
                        help="as many axes as the vectors have directions, checked to span them: every "
                             "size short of the whole is served")
    parser.add_argument("--keep-axes", action="store_true",
                        help="keep the stored axes (fitted on these texts) as the first ones; fit the rest")
    parser.add_argument("--max-texts", type=int, default=None, help="use at most this many texts")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        texts = read_texts(args.texts, args.max_texts)
        entries = add_dimensions(args.bundle, texts, args.sizes, args.threads, args.span, args.keep_axes)
    except ValueError as exc:  # BundleError too
        print(f"dimensions: error: {exc}", file=sys.stderr)
        return 2
    projection = entries["matryoshka_projection"]
    spans = (f"; they span the vectors (residual {projection['residual']:.2g}): any size to "
             f"{entries['matryoshka_dims'][0] - 1}" if projection.get("spans_the_vector") else "")
    print(f"{args.bundle}: dimensions {entries['matryoshka_dims']} from {len(texts)} texts, "
          f"{projection['axes']} axes in {projection['file']}{spans}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
