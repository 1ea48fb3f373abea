"""The bundle contract (TORCH-FREE): graph names and I/O, label names, the manifest file.

A bundle directory holds ONNX graphs, `vocab.json` and `manifest.json`. The manifest names every
graph with its input/output names, label names, max length and embedding dim, and records the
sha256 of every file so a tampered or half-copied bundle is refused before it is served. The
export writes it (`model_export`), the runtime reads it (`disan.runtime`); both take graph names,
I/O names and default labels from `GRAPHS` and `DEFAULT_LABELS` below, and nothing else.

Graph I/O (all batch and sequence axes dynamic): ids int64 [B,n], masks bool [B,n];
embedding float [B,D]; probs float [B,K]; attn_fw/attn_bw [B,n,n]; gate_fw, gate_bw, s2t [B,n].
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "disan-bundle"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class GraphSpec:
    """One graph of the contract: its name, default file and I/O names (feed order)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    @property
    def task(self) -> str:
        """The head whose labels this graph's `probs` use ("encoder" has none)."""
        return self.name.removesuffix("_explain")


SENTENCE = ("ids", "mask")
PAIR = ("premise_ids", "premise_mask", "hypothesis_ids", "hypothesis_mask")
EXPLAIN_OUTPUTS = ("probs", "attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t")
GRAPHS: dict[str, GraphSpec] = {g.name: g for g in (
    GraphSpec("encoder", SENTENCE, ("embedding",)),
    GraphSpec("nli", PAIR, ("probs",)),
    GraphSpec("sentiment", SENTENCE, ("probs",)),
    GraphSpec("sentiment_explain", SENTENCE, EXPLAIN_OUTPUTS),  # optional
)}
REQUIRED_GRAPHS = ("encoder", "nli", "sentiment")

NLI_LABELS = ["entailment", "neutral", "contradiction"]
SST5_LABELS = ["very negative", "negative", "neutral", "positive", "very positive"]
SST2_LABELS = ["negative", "positive"]
# Labels a graph's probs use when the manifest names none (bundles of older exports).
DEFAULT_LABELS = {"nli": NLI_LABELS, "sentiment": SST5_LABELS}


class BundleError(ValueError):
    """A bundle that cannot be served: missing, tampered, or from another format version."""


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(bundle_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Fill in format fields and the sha256 of every file in `bundle_dir`, then write it."""
    bundle_dir = Path(bundle_dir)
    manifest = {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION}
    manifest["files"] = {
        p.name: sha256_file(p)
        for p in sorted(bundle_dir.iterdir())
        if p.is_file() and p.name != MANIFEST_NAME and not p.name.startswith(".")
        and p.suffix in {".onnx", ".json", ".data"}
    }
    path = bundle_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def load_manifest(bundle_dir: str | Path, verify_hashes: bool = True) -> dict[str, Any]:
    """Read and check a bundle's manifest; raise BundleError with a one-line reason if unusable."""
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"no {MANIFEST_NAME} in {bundle_dir} (create a bundle with `disan export`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{path}: bundle format version {version} is not supported (this code reads version "
            f"{FORMAT_VERSION}); re-export it with `disan export`"
        )
    missing = [g for g in REQUIRED_GRAPHS if g not in manifest.get("graphs", {})]
    if missing:
        raise BundleError(f"{path}: manifest lacks graphs {missing}")
    if verify_hashes:
        verify_files(bundle_dir, manifest)
    return manifest


def verify_files(bundle_dir: Path, manifest: dict[str, Any]) -> None:
    """Check every file listed in the manifest exists and matches its sha256."""
    files = manifest.get("files") or {}
    if not files:
        raise BundleError(f"{bundle_dir / MANIFEST_NAME}: lists no file hashes")
    for name, expected in files.items():
        file = bundle_dir / name
        if not file.is_file():
            raise BundleError(f"{file}: listed in the manifest but missing")
        actual = sha256_file(file)
        if actual != expected:
            raise BundleError(
                f"{file}: sha256 {actual[:12]}... does not match the manifest ({expected[:12]}...); "
                "the bundle was modified or copied incompletely"
            )
