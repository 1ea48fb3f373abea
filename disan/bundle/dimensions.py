"""Shorter vectors of a bundle's embed route (TORCH-FREE: numpy): how `dimensions=m` is made.

An encoder trained with Matryoshka prefixes serves the first m components of its vector. Any
other serves m components through the bundle's principal axes (`dimensions.npy`, written by
`python -m model_export.dimensions`): the vector's coordinates on the first m axes. The axes are
the uncentered principal directions of the encoder's vectors of a broad set of texts, so the first
m coordinates are the best m-dimensional summary of those vectors in the least-squares sense, and
all of them together are a rotation (cosines of whole vectors unchanged). The embed route's vector is a linear
map of DiSAN's 2*d_h sentence vector plus a bias, so its components span at most 2*d_h + 1
directions: that many axes lose nothing. A bundle whose axes span the vector that way
(`matryoshka_projection.spans_the_vector`) serves every size: past its K axes, the coordinates on K
axes and zeros after them, the same vector in m components (any orthonormal completion of the
axes gives every vector the encoder makes a zero coordinate there).

The manifest names the file (`matryoshka_projection`); `disan.runtime` loads it once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.manifest import BundleError, load_manifest, matryoshka_dims

PROJECTION_FILE = "dimensions.npy"


def projection_entry(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's `matryoshka_projection` ({"file", "axes", ...}) or None."""
    entry = manifest.get("matryoshka_projection")
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        raise BundleError(f"matryoshka_projection must be an object naming its file, got {entry!r}")
    return entry


def load_projection(bundle_dir: str | Path, manifest: dict[str, Any], dim: int | None = None
                    ) -> np.ndarray | None:
    """The bundle's principal axes, float32 [D, K] (None: its sizes are trained prefixes); where they
    span the vector, with zero columns after them up to D - 1 (every size short of the whole is then
    a product with the first m columns). Raises BundleError when the file is missing, not an array
    of that shape, or has fewer axes than the manifest says or than the largest shorter size it
    lists needs."""
    entry = projection_entry(manifest)
    if entry is None:
        return None
    path = Path(bundle_dir) / entry["file"]
    if entry["file"] not in (manifest.get("files") or {}):
        raise BundleError(f"{path.name}: matryoshka_projection names a file the manifest does not list")
    try:
        axes = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: not a numpy array ({exc})") from exc
    whole = int(manifest.get("embedding_dim") if dim is None else dim)
    sizes = matryoshka_dims(manifest, whole)
    if len(sizes) < 2:
        raise BundleError(f"{path.name}: matryoshka_projection without shorter matryoshka_dims")
    spans = spans_the_vector(manifest)
    need = int(entry.get("axes") or 0) if spans else max(sizes[1], any_size_up_to(manifest))
    if axes.ndim != 2 or axes.shape[0] != whole or axes.shape[1] < need or need >= whole:
        raise BundleError(f"{path.name}: shape {axes.shape}, need [{whole}, >= {need}] "
                          f"for the sizes {sizes} and any up to the manifest's axes")
    axes = axes.astype(np.float32)
    if spans:  # past the span every vector's coordinate is 0 (module docstring)
        axes = np.pad(axes[:, :need], ((0, 0), (0, whole - 1 - need)))
    return axes


def bundle_projection(bundle_dir: str | Path) -> np.ndarray | None:
    """`load_projection` of a bundle folder (its manifest read, the files' hashes not checked)."""
    return load_projection(bundle_dir, load_manifest(bundle_dir, verify_hashes=False))


def spans_the_vector(manifest: dict[str, Any]) -> bool:
    """Whether the bundle's principal axes span every vector its encoder makes (`python -m
    model_export.dimensions --span` checked it on its fit texts), so that sizes past them are served."""
    entry = projection_entry(manifest)
    return bool(entry and entry.get("spans_the_vector") is True)


def any_size_up_to(manifest: dict[str, Any]) -> int:
    """The largest `dimensions` below the whole vector that is served at any size: a bundle with
    principal axes serves every m from 1 to its axes' count (the coordinates on its first m axes, the
    best m-dimensional summary whatever m is), and every m short of the whole where the axes span the
    vector; 0 where the shorter sizes are trained prefixes, of which only the trained ones
    (`matryoshka_dims`) are good vectors."""
    entry = projection_entry(manifest)
    if entry is None:
        return 0
    if spans_the_vector(manifest):
        return int(manifest["embedding_dim"]) - 1
    return int(entry.get("axes") or 0)


def every_size(allowed: Sequence[int], up_to: int) -> bool:
    """Whether every size from 1 to the whole (`allowed[0]`) is served: the sizes up to `up_to`
    reach the one below the whole (axes that span the vector)."""
    return up_to >= allowed[0] - 1


def sizes_text(allowed: Sequence[int], up_to: int = 0) -> str:
    """The sizes a model serves, as the refusals say them."""
    if every_size(allowed, up_to):
        return f"any from 1 to {allowed[0]} (measured: {list(allowed)})"
    if up_to:
        return f"{allowed[0]} or any from 1 to {up_to} (measured: {list(allowed)})"
    return f"one of {list(allowed)}"


def dimensions_problem(dimensions: object, allowed: Sequence[int], up_to: int = 0) -> str | None:
    """Why `dimensions` cannot be served (not an integer, or not one of the `allowed` sizes nor from
    1 to `up_to` (`any_size_up_to`), which the message names), or None: the one message of
    `Encoder.encode` and the service."""
    if not isinstance(dimensions, (int, np.integer)) or isinstance(dimensions, bool):
        return f"dimensions: an integer, {sizes_text(allowed, up_to)}; got {type(dimensions).__name__}"
    if int(dimensions) not in allowed and not 1 <= int(dimensions) <= up_to:
        if up_to:
            return f"dimensions: {dimensions} is not a size this model serves: {sizes_text(allowed, up_to)}"
        return f"dimensions: {dimensions} is not a size this model serves; the sizes are {list(allowed)}"
    return None


def served_size_problem(dimensions: object, manifest: dict[str, Any], dim: int | None = None) -> str | None:
    """`dimensions_problem` against the sizes the bundle of `manifest` serves (`matryoshka_dims`, and
    any up to `any_size_up_to`): the one check of `Encoder.encode`, the service and `disan embed`."""
    return dimensions_problem(dimensions, matryoshka_dims(manifest, dim), any_size_up_to(manifest))


def principal_axes(vectors: np.ndarray, k: int) -> np.ndarray:
    """The first `k` uncentered principal directions of `vectors` [N, D] as columns, float64 [D, k],
    strongest first; each axis's sign set so its largest component is positive (the same axes
    whatever the SVD's signs)."""
    if not 1 <= k <= vectors.shape[1]:
        raise ValueError(f"k={k}: from 1 to the vectors' size {vectors.shape[1]}")
    _, _, vt = np.linalg.svd(np.asarray(vectors, dtype=np.float64), full_matrices=False)
    axes = vt[:k].T
    signs = np.sign(axes[np.abs(axes).argmax(axis=0), np.arange(k)])
    return axes * signs


def require_within_the_axes(sizes: Sequence[int], projection: np.ndarray | None, bundle: object) -> None:
    """ValueError naming the sizes in `sizes`, short of the whole vector, that a bundle with
    `projection` [D, K] cannot make (more than its K axes; a bundle of prefixes makes any):
    checked before an evaluation embeds anything, whose row would otherwise be the K-d vector."""
    if projection is None:
        return
    whole, axes = projection.shape
    past = [m for m in sizes if axes < m < whole]
    if past:
        raise ValueError(f"--dimensions {' '.join(map(str, past))}: {bundle} serves sizes up to its {axes} "
                         f"principal axes, and {whole}")


def axes_digest(projection: np.ndarray | None, m: int) -> str:
    """What makes `dimensions=m`, as a sha256: "prefix", or the first m columns of `projection` as
    served (`load_projection`), so that axes added after them leave size m the same vectors
    (`disan bundle-diff`, a resumed `disan embed` job)."""
    if projection is None:
        return "prefix"
    return "axes:" + hashlib.sha256(np.ascontiguousarray(projection[:, :m]).tobytes()).hexdigest()


def shorten(vectors: np.ndarray, m: int, projection: np.ndarray | None) -> np.ndarray:
    """Rows of `m` components (not normalised): their first m, or with `projection` [D, K] their
    coordinates on its first m axes (m at most K: past them the axes cannot make m components)."""
    if projection is None:
        return np.ascontiguousarray(vectors[..., :m])
    if m > projection.shape[1]:
        raise ValueError(f"dimensions {m}: more than the bundle's {projection.shape[1]} principal axes")
    return (vectors @ projection[:, :m]).astype(np.float32, copy=False)
