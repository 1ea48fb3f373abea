"""The bundle contract (TORCH-FREE): graph names and I/O, graph sets, label names, the manifest.

A bundle directory holds ONNX graphs, the weights they share (`weights.data`), `vocab.json` and
`manifest.json`. The export writes it (`model_export`), the runtime reads it (`disan.runtime.runtime`);
both take graph names, I/O names and default labels from `GRAPHS` and `DEFAULT_LABELS` below.

Graphs (all batch and sequence axes dynamic; ids int64 [B,n], masks bool [B,n], outputs float32):
    encoder            ids, mask -> embedding [B,D]     (the sentence encoder: /embed, encode())
    encoder_explain    ids, mask -> embedding [B,D], s2t [B,n], loo_embedding [B,n,D]   (optional)
    nli_encoder        ids, mask -> embedding [B,E]     (optional: the NLI model's own encoder)
    nli_encoder_explain   as encoder_explain, of nli_encoder                          (optional)
    nli_head           premise_embedding, hypothesis_embedding [B,E] -> probs [B,3]
    sentiment          ids, mask -> probs [B,K]                (its own encoder, inside the graph)
    sentiment_explain  ids, mask -> probs, attn_fw, attn_bw [B,n,n], gate_fw, gate_bw, s2t [B,n]
                                                                                      (optional)
NLI runs as the NLI route's encoder (premises and hypotheses) then nli_head. `loo_embedding[:, i]`
is the embedding with token i left out of the source2token pooling
(`disan.model.pooled_without_each`): the head on it tells which tokens drive an NLI label.

Routes: which graph serves what (`routes(manifest)`, ROUTES the defaults). A bundle exported
from the NLI and sentiment checkpoints alone has no "routes" entry: `encoder` is the NLI model's
encoder and serves both /embed and /nli (which then share its batches). A bundle exported with a
distilled sentence encoder (`disan export --embed`) says
    "routes": {"embed": "encoder", "embed_explain": "encoder_explain", "nli": "nli_encoder",
               "nli_explain": "nli_encoder_explain", "nli_head": "nli_head", "sentiment": ...}
so /embed, /v1/embeddings, /similarity and `disan.Encoder.encode` run that encoder, and /nli the
NLI model's own (`nli_encoder` into `nli_head`). Each graph's manifest entry names its "source"
model ("nli", "sentiment", "embed"). The vocabulary is then the NLI model's (equal to the
sentiment model's) followed by the distilled encoder's other words: ids past a model's own
table are unknown words to it (`disan.model.DiSANEncoder`), and the distilled encoder's table
is re-indexed to the bundle's order (`model_export.embed`).

Format version 2 (this code reads only 2; version 1 bundles, one fp32 graph set with the whole
NLI model in one graph, are refused with a message saying how to rebuild them):

    "graphs": {graph: {"inputs", "outputs", "source": "nli"|"sentiment", "labels"}}
    "sets": {"cpu"|"gpu": {"provider", "attention_chunk_cells", "default_variant",
             "variants": {"fp32"|"fp16"|"int8": {"files": {graph: file}, ...measurements}}}}
    "weights": {"file": "weights.data", ...}   every large initializer of every graph, stored
                                                once (ONNX external data shared by the graphs)
    "files": {file: sha256}                     every file of the bundle but the manifest
    "routes": {route: graph}                    optional (see Routes above)
    "route_fingerprints": {route: {"set/variant": sha256}}   optional: what each route computes
                                                (its graph, the weight bytes it reads, the
                                                tokenizer); equal across bundles = the same
                                                outputs (`model_export.bundle_diff`)
    "graphs"[graph]["tokenizer"]: "tokenizer.json"   optional: the graph reads subword pieces
                                                through this Hugging Face tokenizer file
                                                (disan.text.pieces) instead of the bundle's
                                                word vocabulary (`graph_tokenizer`); a route and
                                                its explain route read the same one
    "matryoshka_dims": [D, m2, ...]            optional: the sizes the embed route's encoder was
                                                trained to serve (Matryoshka: its vector's first
                                                m components are a vector too), descending from
                                                embedding_dim; absent: only D (`matryoshka_dims`)
    "matryoshka_projection": {"file": "dimensions.npy", "axes": K, ...}   optional: the shorter
                                                sizes are coordinates on these principal axes
                                                (fp16 [D, K]), not prefixes (disan.bundle.dimensions;
                                                `python -m model_export.dimensions` writes it);
                                                "spans_the_vector": true where the K axes span
                                                every vector (every size short of D served)
    plus name, created, vocab, vocab_size, max_len, embedding_dim (the encoder graph's D),
    models (configs, labels, metrics; "embed" too with --embed), sources (file names + sha256,
    never paths; each checkpoint a source was made from named once, under its sha256, in
    "lineage": `disan.bundle.lineage`), versions, verification, sizes. `weights.embedding_storage` says
    how the word-vector tables are stored, one storage or {model: storage}: fp32, fp16 (`/half`), int8
    (`/int8` per-row symmetric int8 plus `/scale`, an fp32 scale per row; dequantised by a Cast
    and a Mul inside the graphs) or "int8+int4:N" (int8 but for the table's last N rows, stored
    as per-row int4 in `/int4`, two values a byte, with `/scale4`). `weights.matrix_storage`,
    where present, says the same of every other parameter ({model: fp32 or fp16}; an fp16 one is
    read through one Cast to fp32).

The `cpu` set computes the token2token attention in query-row chunks (an ONNX Scan, fastest on a
CPU cache); the `gpu` set unchunked, fp16 by default with fp32 kept for parity. The runtime picks
the set of the provider that really loaded and the set's default variant unless told otherwise.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disan.text.pieces import AnyTokenizer, read_tokenizer

FORMAT = "disan-bundle"
FORMAT_VERSION = 2
MANIFEST_NAME = "manifest.json"
WEIGHTS_FILE = "weights.data"


@dataclass(frozen=True)
class GraphSpec:
    """One graph of the contract: its name, I/O names (feed order), task and whether required."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    task: str                # whose weights and labels: "nli" | "sentiment"
    required: bool = True


SENTENCE = ("ids", "mask")
HEAD_INPUTS = ("premise_embedding", "hypothesis_embedding")
EXPLAIN_OUTPUTS = ("probs", "attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t")
ENCODER_EXPLAIN_OUTPUTS = ("embedding", "s2t", "loo_embedding")
GRAPHS: dict[str, GraphSpec] = {g.name: g for g in (
    GraphSpec("encoder", SENTENCE, ("embedding",), "nli"),
    GraphSpec("encoder_explain", SENTENCE, ENCODER_EXPLAIN_OUTPUTS, "nli", required=False),
    GraphSpec("nli_encoder", SENTENCE, ("embedding",), "nli", required=False),
    GraphSpec("nli_encoder_explain", SENTENCE, ENCODER_EXPLAIN_OUTPUTS, "nli", required=False),
    GraphSpec("nli_head", HEAD_INPUTS, ("probs",), "nli"),
    GraphSpec("sentiment", SENTENCE, ("probs",), "sentiment"),
    GraphSpec("sentiment_explain", SENTENCE, EXPLAIN_OUTPUTS, "sentiment", required=False),
)}
REQUIRED_GRAPHS = tuple(name for name, g in GRAPHS.items() if g.required)
# Route -> the graph serving it when the manifest names none (the format-2 layout before routes).
ROUTES = {"embed": "encoder", "embed_explain": "encoder_explain", "nli": "encoder",
          "nli_explain": "encoder_explain", "nli_head": "nli_head", "sentiment": "sentiment",
          "sentiment_explain": "sentiment_explain"}
# Outputs with token axes right after the batch axis (how many): cut to a row's own length.
TOKEN_AXES = {"attn_fw": 2, "attn_bw": 2, "gate_fw": 1, "gate_bw": 1, "s2t": 1, "loo_embedding": 1}
# Graph set -> the execution provider it is shaped for.
GRAPH_SETS = {"cpu": "CPUExecutionProvider", "gpu": "CUDAExecutionProvider"}
VARIANTS = ("fp32", "fp16", "int8")
# How a bundle stores its word-vector tables (`weights.embedding_storage`): the variants' names
# and one more, a different fact (a table's bytes on disk, not which graph files are loaded).
EMBEDDING_STORAGES = ("fp32", "fp16", "int8", "int8+int4:N")
# int8, the table's last N rows (its rarest words: vocabularies are in frequency order) in per-row
# int4 (`/int4`, two values a byte, plus `/scale4`)
INT4_TAIL = "int8+int4:"
# ... and its other parameters (`weights.matrix_storage`, {model: storage}; absent: all fp32).
MATRIX_STORAGES = ("fp32", "fp16")


def storage_kind(storage: str) -> str:
    """`storage`'s name among EMBEDDING_STORAGES and MATRIX_STORAGES ("int8+int4:N" for every
    "int8+int4:<rows>" with rows >= 1); the value itself if it is none of them."""
    rows = storage.removeprefix(INT4_TAIL) if storage.startswith(INT4_TAIL) else ""
    return INT4_TAIL + "N" if rows.isdigit() and int(rows) >= 1 else storage


def int4_rows(storage: str) -> int:
    """How many rows at the end of a table `storage` keeps in int4 (0 but for "int8+int4:N")."""
    return int(storage.removeprefix(INT4_TAIL)) if storage_kind(storage) == INT4_TAIL + "N" else 0


NLI_LABELS = ["entailment", "neutral", "contradiction"]
SST5_LABELS = ["very negative", "negative", "neutral", "positive", "very positive"]
SST2_LABELS = ["negative", "positive"]
# Labels a graph's probs use when the manifest names none.
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
    """Fill in format fields, the sha256 and size of every file in `bundle_dir`, then write it."""
    bundle_dir = Path(bundle_dir)
    manifest = {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION}
    files = [p for p in sorted(bundle_dir.iterdir())
             if p.is_file() and p.name != MANIFEST_NAME and not p.name.startswith(".")
             and p.suffix in {".onnx", ".json", ".data", ".npy", ".npz"}]
    manifest["files"] = {p.name: sha256_file(p) for p in files}
    sizes = {p.name: p.stat().st_size for p in files}
    manifest["sizes"] = {"files": sizes, "total_bytes": sum(sizes.values())}
    path = bundle_dir / MANIFEST_NAME
    # compact: the bundle's byte budget counts the manifest too (`jq . manifest.json` reads it)
    path.write_text(json.dumps(manifest, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def read_manifest_json(bundle_dir: str | Path) -> dict[str, Any]:
    """The manifest as JSON, any format version (for tools that convert old bundles)."""
    path = Path(bundle_dir) / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"no {MANIFEST_NAME} in {bundle_dir} (create a bundle with `disan export`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: not a {FORMAT} manifest")
    return manifest


def load_manifest(bundle_dir: str | Path, verify_hashes: bool = True) -> dict[str, Any]:
    """Read and check a bundle's manifest; raise BundleError with a one-line reason if unusable."""
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / MANIFEST_NAME
    manifest = read_manifest_json(bundle_dir)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{path}: bundle format version {version} is not supported (this code reads version "
            f"{FORMAT_VERSION}: one graph set per provider, weights stored once); re-export it with "
            "`disan export` (a version-1 bundle whose checkpoints are gone: `python -m "
            "model_export.recover OLD_BUNDLE CKPT_DIR` rebuilds them from its graphs)")
    missing = [g for g in REQUIRED_GRAPHS if g not in manifest.get("graphs", {})]
    if missing:
        raise BundleError(f"{path}: manifest lacks graphs {missing}")
    sets = manifest.get("sets")
    if not isinstance(sets, dict) or not sets:
        raise BundleError(f"{path}: manifest lists no graph sets")
    served = routes(manifest, path)  # raises on a route that cannot be served
    check_tokenizers(manifest, served, path)
    matryoshka_dims(manifest, where=path)  # raises on sizes that are not prefixes of the vector
    # a graph a (non-explain) route points at is as required as the contract's own
    needed = [*REQUIRED_GRAPHS, *(g for r, g in served.items()
                                  if not r.endswith("_explain") and g not in REQUIRED_GRAPHS)]
    for set_name, variant in available_variants(manifest):
        files = variant_files(manifest, set_name, variant)
        lacking = [g for g in needed if g not in files]
        if lacking:
            raise BundleError(f"{path}: graph set {set_name}/{variant} lacks graphs {lacking}")
    if verify_hashes:
        verify_files(bundle_dir, manifest)
    return manifest


def routes(manifest: dict[str, Any], where: str | Path = MANIFEST_NAME) -> dict[str, str]:
    """Route -> graph: the manifest's "routes" over ROUTES. Each must be a route of ROUTES and
    point at a graph with the I/O of its default (an explain route may point at a graph the
    bundle lacks: that explanation is then unavailable); raises BundleError otherwise."""
    given = manifest.get("routes") or {}
    if not isinstance(given, dict):
        raise BundleError(f"{where}: routes must be an object of route -> graph")
    for route, graph in given.items():
        spec, default = GRAPHS.get(graph), GRAPHS[ROUTES[route]] if route in ROUTES else None
        if default is None:
            raise BundleError(f"{where}: unknown route {route!r} (routes are {sorted(ROUTES)})")
        if spec is None or (spec.inputs, spec.outputs) != (default.inputs, default.outputs):
            raise BundleError(f"{where}: route {route!r} -> {graph!r}: not a graph with the I/O of "
                              f"{default.name!r}")
        if not route.endswith("_explain") and graph not in (manifest.get("graphs") or {}):
            raise BundleError(f"{where}: route {route!r} -> {graph!r}, which the bundle lacks")
    return {**ROUTES, **given}


def graph_tokenizer(manifest: dict[str, Any], graph: str) -> str:
    """The file `graph` reads text through: its own "tokenizer" (subword pieces, a Hugging Face
    tokenizer.json) or the bundle's word vocabulary ("vocab")."""
    entry = (manifest.get("graphs") or {}).get(graph) or {}
    return str(entry.get("tokenizer") or manifest.get("vocab", "vocab.json"))


class GraphTokenizers:
    """graph -> the tokenizer it reads (`graph_tokenizer`), each file read once (`known`: files
    already loaded, e.g. a vocabulary with its settings applied). Raises what `read_tokenizer` does."""

    def __init__(self, bundle_dir: str | Path, manifest: dict[str, Any],
                 known: dict[str, AnyTokenizer] | None = None) -> None:
        self.bundle_dir, self.manifest, self.files = Path(bundle_dir), manifest, dict(known or {})

    def __call__(self, graph: str) -> AnyTokenizer:
        file = graph_tokenizer(self.manifest, graph)
        if file not in self.files:
            self.files[file] = read_tokenizer(self.bundle_dir / file)
        return self.files[file]


def check_tokenizers(manifest: dict[str, Any], served: dict[str, str], where: str | Path) -> None:
    """Raise BundleError unless every graph's "tokenizer" is a .json file name listed with a hash
    and each explain route reads what its route reads (explanations show the model's tokens)."""
    files = manifest.get("files") or {}
    for graph, entry in (manifest.get("graphs") or {}).items():
        name = (entry or {}).get("tokenizer")
        if name is None:
            continue
        listed = not files or name in files
        if not isinstance(name, str) or "/" in name or not name.endswith(".json") or not listed:
            raise BundleError(f"{where}: graph {graph!r} names tokenizer {name!r}: expected a .json file of "
                              "the bundle, listed in its files")
    for route, graph in served.items():
        plain = served.get(route.removesuffix("_explain"))
        if route.endswith("_explain") and plain and graph in (manifest.get("graphs") or {}) \
                and graph_tokenizer(manifest, graph) != graph_tokenizer(manifest, plain):
            raise BundleError(f"{where}: route {route!r} reads {graph_tokenizer(manifest, graph)} but "
                              f"{route.removesuffix('_explain')!r} reads {graph_tokenizer(manifest, plain)}")


def matryoshka_dims(manifest: dict[str, Any], dim: int | None = None,
                    where: str | Path = MANIFEST_NAME) -> list[int]:
    """The vector sizes the embed route serves, largest first: the manifest's `matryoshka_dims`
    (the prefixes its encoder was trained to make vectors of their own), or [the whole vector's
    size] where it has none (every bundle exported from a checkpoint without them). `dim`: the
    whole size (default: the manifest's embedding_dim). Raises BundleError unless the sizes are
    distinct positive integers, descending, the first the whole size."""
    whole = manifest.get("embedding_dim") if dim is None else dim
    given = manifest.get("matryoshka_dims")
    if given is None:
        return [int(whole)] if isinstance(whole, int) and not isinstance(whole, bool) else []
    ok = (isinstance(given, list) and bool(given)
          and all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in given)
          and all(a > b for a, b in zip(given, given[1:], strict=False))
          and (whole is None or given[0] == whole))
    if not ok:
        raise BundleError(f"{where}: matryoshka_dims {given!r} must be distinct positive integers, "
                          f"largest first, the first the embedding dim ({whole})")
    return list(given)


def fingerprints_in_use(manifest: dict[str, Any], graph_set: str, variant: str) -> dict[str, str]:
    """{route: fingerprint} of the graphs one graph set and variant serve (the manifest's
    `route_fingerprints`): the same embed fingerprint means the same vectors, so a client or a
    resumed `disan embed` job compares it across restarts and bundles; a bundle exported before
    they were recorded gives {}."""
    key = f"{graph_set}/{variant}"
    given = manifest.get("route_fingerprints") or {}
    return {route: str(fps[key]) for route, fps in given.items() if isinstance(fps, dict) and key in fps}


def available_variants(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(set, variant) pairs the bundle carries, e.g. [("cpu", "fp32"), ("gpu", "fp16"), ...]."""
    return [(set_name, variant) for set_name, entry in (manifest.get("sets") or {}).items()
            for variant in (entry.get("variants") or {})]


def variant_files(manifest: dict[str, Any], set_name: str, variant: str) -> dict[str, str]:
    """Graph -> file name of one variant of one set (empty if the bundle lacks it)."""
    entry = ((manifest.get("sets") or {}).get(set_name) or {}).get("variants") or {}
    return dict((entry.get(variant) or {}).get("files") or {})


def verify_files(bundle_dir: Path, manifest: dict[str, Any]) -> None:
    """Check every file listed in the manifest exists and matches its sha256."""
    files = manifest.get("files") or {}
    if not files:
        raise BundleError(f"{bundle_dir / MANIFEST_NAME}: lists no file hashes")
    referenced = {f for s, v in available_variants(manifest) for f in variant_files(manifest, s, v).values()}
    unlisted = sorted(referenced - set(files))
    if unlisted:
        raise BundleError(f"{bundle_dir / MANIFEST_NAME}: graph files without a hash: {unlisted}")
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
