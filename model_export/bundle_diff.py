"""`disan bundle-diff OLD NEW`: which routes of two bundles compute the same thing.

Before replacing a served bundle, an operator needs to know whether the vectors change (an index
built with the old `/embed` must then be re-embedded) and which task outputs may move. Comparing
files is not enough: every graph reads its weights from the shared `weights.data` by offset, so
one changed tensor can move the offsets (and the bytes) of graphs whose computation is unchanged,
and an unchanged graph file says nothing about the weight bytes it points at.

So each route's graph is fingerprinted as it computes: the graph with every external initializer
replaced by the sha256 of the bytes it reads, plus the manifest's description of the graph, the
vocabulary file's content (its JSON in one canonical form: a vocabulary written compact or indented
reads texts the same) and `max_len` (how texts become ids). A route is `same` when every graph set and
variant both bundles carry has the same fingerprint: the same graph and weights read through the
same tokenizer, so the same outputs on the same provider. `changed` is conservative: a re-export
that only renames nodes is reported as changed. Endpoints by route (`disan.bundle.manifest` ROUTES):
embed -> /embed, /v1/embeddings, /similarity; nli + nli_head -> /nli; sentiment -> /sentiment.
Beside the routes: the shorter sizes (`embed dimensions`) and the sparse vectors of
`/embed_sparse` (`embed sparse`: same, changed, added or removed; added changes nothing a client has).

Exit status as diff(1): 0 every compared route the same, 1 some differ, 2 trouble.

    disan bundle-diff models/default runs/new-bundle [--routes embed] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.dimensions import any_size_up_to, axes_digest, load_projection
from disan.bundle.lexical import lexical_entry
from disan.bundle.manifest import (
    available_variants,
    graph_tokenizer,
    load_manifest,
    matryoshka_dims,
    routes,
    sha256_file,
    variant_files,
)


def graph_fingerprint(path: Path, digests: dict[tuple[str, int, int], str] | None = None) -> str:
    """sha256 of the ONNX graph at `path` with each external initializer's location (file,
    offset, length) replaced by the sha256 of the bytes it reads: layout-independent. `digests`
    keeps each location's sha256 across calls: the graphs of one bundle share most of their
    weights, so each stored tensor is read and hashed once."""
    import onnx  # the train extra, as export and verify
    from google.protobuf.message import DecodeError  # onnx's own dependency

    digests = {} if digests is None else digests
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:  # a file the manifest lists but that is not a graph: one line
        raise ValueError(f"{path}: not an ONNX graph ({exc})") from None
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {e.key: e.value for e in tensor.external_data}
        key = (where["location"], int(where.get("offset", 0)), int(where["length"]))
        if key not in digests:
            with open(path.parent / key[0], "rb") as f:
                f.seek(key[1])
                digests[key] = hashlib.sha256(f.read(key[2])).hexdigest()
        del tensor.external_data[:]
        tensor.external_data.add(key="sha256", value=digests[key])
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def reading_digest(path: Path) -> str:
    """sha256 of how a tokenizer file (`vocab.json`, `tokenizer.json`) turns text into ids: its JSON
    with sorted keys and no spaces, so a vocabulary written again in another layout (export writes
    it compact since 2026-12-06) fingerprints the same; a file that is not JSON, by its bytes."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return sha256_file(path)
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def route_fingerprints(bundle: Path, manifest: dict[str, Any] | None = None, vocab_as_bytes: bool = False,
                       digests: dict[tuple[str, int, int], str] | None = None) -> dict[str, dict[str, str]]:
    """route -> {"set/variant": fingerprint} of the graph each route is served by, in every graph
    set and variant of the bundle (routes whose graph the bundle lacks are left out). `disan
    export` records them as the manifest's `route_fingerprints` (what `/info` reports for the
    graphs in use); `compare` recomputes them from the files, trusting no manifest.
    `vocab_as_bytes`: the rule of bundles exported before 2026-12-06, which hashed the tokenizer
    file's bytes (`disan verify` accepts fingerprints recorded under either rule). `digests` keeps
    the stored tensors' sha256 across calls (graph_fingerprint), so a second rule hashes none again."""
    manifest = load_manifest(bundle) if manifest is None else manifest
    digest = sha256_file if vocab_as_bytes else reading_digest
    reading: dict[str, str] = {}  # tokenizer file -> its digest: how texts become a graph's ids
    graphs = manifest.get("graphs") or {}
    cache: dict[str, str] = {}  # graph file -> its fingerprint
    digests = {} if digests is None else digests  # stored tensor -> sha256 of its bytes
    out: dict[str, dict[str, str]] = {}
    for route, graph in routes(manifest, bundle).items():
        for set_name, variant in available_variants(manifest):
            file = variant_files(manifest, set_name, variant).get(graph)
            if file is None:
                continue
            if file not in cache:
                cache[file] = graph_fingerprint(bundle / file, digests)
            tokenizer = graph_tokenizer(manifest, graph)
            if tokenizer not in reading:
                reading[tokenizer] = digest(bundle / tokenizer)
            spec = json.dumps({"graph": graphs.get(graph), "weights": cache[file],
                               "vocab": reading[tokenizer], "max_len": manifest.get("max_len")},
                              sort_keys=True)
            out.setdefault(route, {})[f"{set_name}/{variant}"] = hashlib.sha256(spec.encode()).hexdigest()
    return out


def dimension_ways(bundle: Path) -> dict[int, str]:
    """Each shorter size the embed route serves (`dimensions`) -> how it is made: "prefix", or
    "axes:<sha256 of the first m axes as served>" (disan.bundle.dimensions): a size is made the same
    way when its leading axes are, whatever axes the file adds after them."""
    manifest = load_manifest(bundle, verify_hashes=False)
    projection = load_projection(bundle, manifest)
    return {m: axes_digest(projection, m) for m in matryoshka_dims(manifest)[1:]}


def compare_dimensions(old: Path, new: Path, embed_same: bool) -> dict[str, Any]:
    """The shorter sizes of both bundles: a size both serve is `changed` when the embed route
    changed or the size is made another way (an index of such vectors must be re-embedded); and
    the sizes served at any size (`up_to`, disan.bundle.dimensions.any_size_up_to): fewer in the
    new bundle (`narrower`) is a change too, since a client's `dimensions` may then be refused."""
    a, b = dimension_ways(old), dimension_ways(new)
    both = sorted(set(a) & set(b), reverse=True)
    changed = [m for m in both if not embed_same or a[m] != b[m]]
    up_to = {side: any_size_up_to(load_manifest(path, verify_hashes=False))
             for side, path in (("old", old), ("new", new))}
    narrower = up_to["new"] < up_to["old"]
    return {"status": "changed" if changed or narrower else "same", "changed": changed, "compared": both,
            "only_old": sorted(set(a) - set(b), reverse=True),
            "only_new": sorted(set(b) - set(a), reverse=True), "up_to": up_to, "narrower": narrower}


def sparse_way(bundle: Path) -> str | None:
    """What the bundle's sparse vectors (`POST /embed_sparse`) are made with, as a sha256 of its IDF
    levels, their scale and the embed route's tokenizer file; None without a lexical table."""
    manifest = load_manifest(bundle, verify_hashes=False)
    entry = lexical_entry(manifest)
    if entry is None:
        return None
    with np.load(bundle / entry["file"], allow_pickle=False) as stored:
        levels = hashlib.sha256(np.ascontiguousarray(stored["levels"]).tobytes()).hexdigest()
    spec = {"levels": levels, "scale": entry["scale"],
            "vocab": reading_digest(bundle / graph_tokenizer(manifest, "encoder"))}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def compare_sparse(old: Path, new: Path) -> str | None:
    """same, changed (an index of the old sparse vectors must be rebuilt), added, removed, or None
    when neither bundle serves sparse vectors."""
    a, b = sparse_way(old), sparse_way(new)
    if a is None and b is None:
        return None
    return "added" if a is None else "removed" if b is None else "same" if a == b else "changed"


def compare(old: Path, new: Path, only: list[str] | None = None) -> dict[str, Any]:
    """{"routes": {route: {"status", "compared", "only_old", "only_new"}}, "changed": [route...]}:
    `status` is same, changed, or missing (no graph set and variant both bundles carry, e.g. a
    route only one serves); `changed` lists every route that is not the same, missing ones too."""
    a, b = route_fingerprints(old), route_fingerprints(new)
    names = only or sorted(set(a) | set(b))
    unknown = [r for r in names if r not in a and r not in b]
    if unknown:
        raise ValueError(f"neither bundle serves route(s) {unknown} (routes: {sorted(set(a) | set(b))})")
    report: dict[str, Any] = {}
    for route in names:
        x, y = a.get(route, {}), b.get(route, {})
        both = sorted(set(x) & set(y))
        if not both:
            status = "missing"
        else:
            status = "same" if all(x[k] == y[k] for k in both) else "changed"
        report[route] = {"status": status, "compared": both,
                         "only_old": sorted(set(x) - set(y)), "only_new": sorted(set(y) - set(x))}
    changed = [r for r, v in report.items() if v["status"] != "same"]
    out = {"old": str(old), "new": str(new), "routes": report, "changed": changed}
    dims = compare_dimensions(old, new, report["embed"]["status"] == "same") if "embed" in report else None
    if dims and (dims["compared"] or dims["only_old"] or dims["only_new"]):  # either serves shorter sizes
        out["dimensions"] = dims
        if dims["changed"] or dims["narrower"]:
            changed.append("embed dimensions")
    sparse = compare_sparse(old, new) if only is None or "embed" in only else None
    if sparse is not None:
        out["sparse"] = sparse
        if sparse in ("changed", "removed"):  # added breaks nothing a client has
            changed.append("embed sparse")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("old", type=Path, help="the bundle served now")
    ap.add_argument("new", type=Path, help="the bundle that would replace it")
    ap.add_argument("--routes", nargs="+", default=None,
                    help="only these routes (e.g. embed: do the vectors change?); default: all")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")


def run(args: argparse.Namespace) -> int:
    """Print one line per route; 0 if every compared route is the same, 1 otherwise (a bundle
    that cannot be read raises, which `disan` turns into one line and exit status 2)."""
    report = compare(args.old, args.new, args.routes)
    for route, row in report["routes"].items():
        extra = "".join(f"; only in {side[5:]}: {', '.join(row[side])}"
                        for side in ("only_old", "only_new") if row[side])
        print(f"{route:18} {row['status']:8} ({', '.join(row['compared']) or 'no common graph set'}{extra})")
    if "dimensions" in report:
        dims = report["dimensions"]
        extra = "".join(f"; only in {side[5:]}: {', '.join(map(str, dims[side]))}"
                        for side in ("only_old", "only_new") if dims[side])
        sizes = ", ".join(map(str, dims["compared"])) or "no shorter size in both"
        if dims["up_to"]["old"] != dims["up_to"]["new"]:
            extra += f"; any size up to {dims['up_to']['old']} in old, {dims['up_to']['new']} in new"
        print(f"{'embed dimensions':18} {dims['status']:8} ({sizes}{extra})")
    if "sparse" in report:
        print(f"{'embed sparse':18} {report['sparse']:8} (POST /embed_sparse: the lexical table)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if report["changed"] else 0
