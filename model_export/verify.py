"""`disan verify DIR`: check a bundle's hashes, then every graph set against PyTorch (or itself).

fp32 graphs of every set must match PyTorch within 1e-5 and predict identical labels, graph by
graph and for NLI as served (the NLI route's encoder on both sentences, then nli_head: see
`disan.bundle.manifest.routes`) against the whole PyTorch NLI model. Parity cases: random-id and
real-sentence batches at lengths 1, 2, 7, 33, 100 (capped at the bundle's max_len) and batch sizes
1 and 16, batch-16 rows with mixed lengths; random ids span the whole bundle vocabulary (with a
distilled encoder: words of either model's vocabulary).

The PyTorch reference comes from, in order:
1. `--checkpoints DIR`: the source checkpoints, found by the sha256 the manifest records;
2. the bundle's own fp32 weights (its initializers are named after the parameters): checks that
   every graph computes `disan.model` with the weights it carries, on any machine with torch;
3. without torch: internal consistency (padded rows vs the same rows alone, CPU vs GPU set,
   each explain graph vs its plain graph).
fp16/int8 variants are compared with their set's fp32 graphs on the staged dev sets
(`--dev-data`, with accuracy against the gold labels) or on generated sentences.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.manifest import (
    GRAPHS,
    BundleError,
    GraphTokenizers,
    available_variants,
    graph_tokenizer,
    load_manifest,
    routes,
    variant_files,
    write_manifest,
)
from disan.text.pieces import AnyTokenizer
from disan.text.tokenizer import Vocab
from model_export.agreement import NLI, agreement_data, meets_bars, variant_agreement
from model_export.references import references_from_bundle, references_from_checkpoints
from model_export.sessions import run_graph, session, trim

LENGTHS = (1, 2, 7, 33, 100)
BATCH_SIZES = (1, 16)
FP32_TOL = 1e-5
# Stand-in "real" sentences when no dev data is given: ordinary English, so token ids follow
# a natural word distribution (repeats, function words) unlike uniform random ids.
SAMPLE_TEXTS = (
    "A man is playing a guitar on the street.",
    "The movie was not as good as I had hoped, but the acting was great.",
    "Two dogs are running through a field of tall grass.",
    "A woman is reading a book in the park while children play nearby.",
    "This film is a total waste of time and money.",
    "The people are sitting at a table and eating dinner together.",
    "An old man walks his dog in the rain.",
    "It is one of the best films of the year, funny and moving.",
)


@dataclass
class Case:
    """One padded batch: name, ids [B,n] int64, mask [B,n] bool."""

    name: str
    ids: np.ndarray
    mask: np.ndarray

    def tiled(self, batch: int) -> Case:
        """This case's rows repeated to `batch` rows (hypotheses for a premise batch)."""
        reps = -(-batch // self.ids.shape[0])
        return Case(self.name, np.tile(self.ids, (reps, 1))[:batch], np.tile(self.mask, (reps, 1))[:batch])


def token_stream(vocab: AnyTokenizer, texts: list[str]) -> list[int]:
    """All texts' token ids concatenated (UNKs included): the pool real-sentence cases cut from."""
    return [i for t in texts for i in vocab.text_ids(t)]


def parity_cases(vocab: AnyTokenizer, max_len: int, texts: list[str] | None = None, seed: int = 0
                 ) -> list[Case]:
    """Random and real batches at every (length, batch size) in LENGTHS x BATCH_SIZES."""
    rng = np.random.default_rng(seed)
    stream = token_stream(vocab, list(texts or SAMPLE_TEXTS))
    lengths = sorted({min(n, max_len) for n in LENGTHS})
    cases = []
    for kind in ("random", "real"):
        for n in lengths:
            for b in BATCH_SIZES:
                row_lens = [n] + ([] if b == 1 else rng.integers(1, n + 1, b - 1).tolist())
                rows = []
                for length in row_lens:
                    if kind == "random":
                        rows.append(rng.integers(2, max(len(vocab), 3), length).tolist())
                    else:
                        start = int(rng.integers(0, len(stream)))
                        rows.append([stream[(start + k) % len(stream)] for k in range(length)])
                enc = Vocab.pad(rows)
                cases.append(Case(f"{kind}/n={n}/B={b}", enc.ids, enc.mask))
    return cases


def graph_cases(bundle_dir: Path, manifest: dict[str, Any], texts: list[str] | None = None):
    """graph -> its `parity_cases`, read through the tokenizer that graph reads (the word
    vocabulary, or a piece tokenizer: disan.bundle.manifest.graph_tokenizer); one set per file."""
    made: dict[str, list[Case]] = {}
    tokenizers = GraphTokenizers(bundle_dir, manifest)

    def cases_of(graph: str) -> list[Case]:
        file = graph_tokenizer(manifest, graph)
        if file not in made:
            made[file] = parity_cases(tokenizers(graph), manifest["max_len"], texts)
        return made[file]

    return cases_of


def _torch_outputs(module, *arrays: np.ndarray) -> list[np.ndarray]:
    import torch  # only the parity modes need torch (see references_from_*)

    with torch.no_grad():
        out = module(*(torch.from_numpy(a) for a in arrays))
    out = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in out]


def _compare(report: dict[str, Any], got: list[np.ndarray], want: list[np.ndarray], probs: bool) -> None:
    for g, w in zip(got, want, strict=True):
        report["finite"] &= bool(np.isfinite(g).all())
        report["max_abs_diff"] = max(report["max_abs_diff"], float(np.abs(g - w).max()) if g.size else 0.0)
    if probs:
        report["labels_identical"] &= bool((got[0].argmax(-1) == want[0].argmax(-1)).all())


def _new_report(cases: int) -> dict[str, Any]:
    return {"max_abs_diff": 0.0, "labels_identical": True, "finite": True, "cases": cases}


def _close(report: dict[str, Any]) -> dict[str, Any]:
    report["passed"] = report["max_abs_diff"] <= FP32_TOL and report["labels_identical"] and report["finite"]
    return report


def check_parity(bundle_dir: Path, manifest: dict[str, Any], references: dict[str, Any],
                 files: dict[str, str], texts: list[str] | None = None,
                 done: dict[str, dict] | None = None) -> dict[str, Any]:
    """ORT (CPU) vs PyTorch for the graphs of one fp32 variant (`files`: graph -> file), and NLI
    as served (encoder on premise and hypothesis, then nli_head) vs the whole NLI model.

    `done` (file -> report) skips files another set already checked (the shared graphs).
    """
    cases_of = graph_cases(bundle_dir, manifest, texts)
    nli_encoder = routes(manifest)["nli"]  # the NLI model's encoder: `encoder`, or `nli_encoder`
    report: dict[str, Any] = {}
    for graph, file in files.items():
        if graph not in references:
            continue
        if done is not None and file in done:
            report[graph] = done[file]
            continue
        cases = cases_of(nli_encoder if graph == "nli_head" else graph)
        pairs = [(case, cases[-1 - k].tiled(case.ids.shape[0])) for k, case in enumerate(cases)]
        sess, entry = session(bundle_dir / file), _new_report(len(cases))
        for prem, hyp in pairs:
            if graph == "nli_head":  # the head alone, fed the PyTorch NLI encoder's vectors
                arrays = (_torch_outputs(references[nli_encoder], prem.ids, prem.mask)[0],
                          _torch_outputs(references[nli_encoder], hyp.ids, hyp.mask)[0])
            else:
                arrays = (prem.ids, prem.mask)
            _compare(entry, run_graph(sess, graph, *arrays), _torch_outputs(references[graph], *arrays),
                     GRAPHS[graph].outputs[0] == "probs")
        report[graph] = _close(entry)
        if done is not None:
            done[file] = report[graph]
    enc, head = session(bundle_dir / files[nli_encoder]), session(bundle_dir / files["nli_head"])
    cases = cases_of(nli_encoder)
    pairs = [(case, cases[-1 - k].tiled(case.ids.shape[0])) for k, case in enumerate(cases)]
    entry = _new_report(len(cases))
    for prem, hyp in pairs:
        u = run_graph(enc, nli_encoder, prem.ids, prem.mask)[0]
        v = run_graph(enc, nli_encoder, hyp.ids, hyp.mask)[0]
        _compare(entry, run_graph(head, "nli_head", u, v),
                 _torch_outputs(references["nli"], prem.ids, prem.mask, hyp.ids, hyp.mask), True)
    report[NLI] = _close(entry)
    return report


def check_consistency(bundle_dir: Path, manifest: dict[str, Any], texts: list[str] | None = None
                      ) -> dict[str, Any]:
    """Without PyTorch: every sentence graph's padded rows vs the same rows alone; the CPU and
    GPU fp32 sets against each other; each explain graph's first output vs its plain graph."""
    cases_of = graph_cases(bundle_dir, manifest, texts)
    fp32 = {s: variant_files(manifest, s, v) for s, v in available_variants(manifest) if v == "fp32"}
    report: dict[str, Any] = {}
    checked: set[str] = set()
    for set_name, files in fp32.items():
        for graph, file in files.items():
            if graph == "nli_head" or file in checked:
                continue
            checked.add(file)
            sess, worst = session(bundle_dir / file), 0.0
            for case in (c for c in cases_of(graph) if c.ids.shape[0] > 1):
                batch_out = run_graph(sess, graph, case.ids, case.mask)
                for r in range(0, case.ids.shape[0], 5):  # a few rows each: keeps verify quick
                    n = int(case.mask[r].sum())
                    alone = run_graph(sess, graph, case.ids[r: r + 1, :n], case.mask[r: r + 1, :n])
                    for name, a, b in zip(GRAPHS[graph].outputs, alone, batch_out, strict=True):
                        worst = max(worst, float(np.abs(trim(name, a[0], n) - trim(name, b[r], n)).max()))
            report[f"{set_name}/{graph}"] = {"padding_invariance_max_abs_diff": worst,
                                             "passed": worst <= FP32_TOL}
    plain = [g for g in GRAPHS if g != "nli_head" and not g.endswith("_explain")]
    pairs = [(("cpu", g), ("gpu", g)) for g in plain]
    pairs += [((s, f"{g}_explain"), (s, g)) for s in fp32 for g in plain]
    for (set_a, graph_a), (set_b, graph_b) in pairs:
        file_a, file_b = fp32.get(set_a, {}).get(graph_a), fp32.get(set_b, {}).get(graph_b)
        if not file_a or not file_b:
            continue
        a, b = session(bundle_dir / file_a), session(bundle_dir / file_b)
        diff = max(float(np.abs(run_graph(a, graph_a, c.ids, c.mask)[0]
                                - run_graph(b, graph_b, c.ids, c.mask)[0]).max())
                   for c in cases_of(graph_a) if c.ids.shape[0] > 1)
        report[f"{set_a}/{graph_a} vs {set_b}/{graph_b}"] = {"max_abs_diff": diff, "passed": diff <= FP32_TOL}
    return report


def _how_to_get_checkpoint_parity(manifest: dict[str, Any]) -> str:
    sources = manifest.get("sources") or {}
    named = ", ".join(f"{t}: {s.get('file')} (sha256 {str(s.get('sha256'))[:12]}...)"
                      for t, s in sources.items() if isinstance(s, dict))
    return ("source checkpoints not given: `disan verify --checkpoints PATH...` with "
            f"{named or 'the source checkpoints'} compares against them")


def exporter_metadata(bundle_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Which graph files still carry the exporter's per-node metadata (the Python stack that made
    each node, with the build machine's file paths): bundles exported before `disan export`
    dropped it (model_export.graphs.onnx_files.strip_node_metadata). Needs onnx (the train extra)."""
    try:  # onnx: the train extra; a service's environment has onnxruntime only
        import onnx

        from model_export.graphs.weights import all_nodes  # onnx, as above
    except ModuleNotFoundError as exc:  # the service's environment
        return {"checked": False, "reason": f"{exc.name} is not installed (the `train` extra has it)"}
    files = sorted({f for s, v in available_variants(manifest)
                    for f in variant_files(manifest, s, v).values()})
    found = [f for f in files if any(len(node.metadata_props) for node in
                                     all_nodes(onnx.load(str(bundle_dir / f), load_external_data=False)))]
    report: dict[str, Any] = {"checked": True, "files": found}
    if found:
        report["fix"] = ("export the bundle again (`disan export` drops the metadata; "
                         "`python -m model_export.recover` rebuilds its checkpoints if they are gone)")
    return report


def fingerprint_check(bundle_dir: Path, manifest: dict[str, Any],
                      digests: dict | None = None) -> dict[str, Any]:
    """Whether the manifest's `route_fingerprints` are what its files compute (`stale`: the routes
    whose recorded fingerprint is not). A bundle exported before they were recorded has none,
    which is not a failure. Needs onnx (the train extra). `digests` keeps the stored tensors'
    sha256 for the caller (route_fingerprints)."""
    recorded = manifest.get("route_fingerprints")
    if recorded is None:
        return {"checked": False, "reason": "the manifest records none (exported before `disan export` did)"}
    try:
        from model_export.bundle_diff import route_fingerprints  # onnx: the train extra

        digests = {} if digests is None else digests  # the stored tensors' sha256, for the older rule too
        actual = route_fingerprints(bundle_dir, manifest, digests=digests)
    except ModuleNotFoundError as exc:  # the service's environment
        return {"checked": False, "reason": f"{exc.name} is not installed (the `train` extra has it)"}
    stale = sorted(r for r in set(recorded) | set(actual) if recorded.get(r) != actual.get(r))
    if not stale:
        return {"checked": True, "stale": []}
    # recorded by an export before 2026-12-06, which hashed the tokenizer file's bytes: valid if
    # every route the current rule disagrees on is what that rule computes
    before = route_fingerprints(bundle_dir, manifest, vocab_as_bytes=True, digests=digests)
    still = [r for r in stale if recorded.get(r) != before.get(r)]
    if still:
        return {"checked": True, "stale": still}
    return {"checked": True, "stale": [], "rule": "tokenizer file bytes (exported before 2026-12-06)"}


def verify_bundle(bundle_dir: str | Path, texts: list[str] | None = None,
                  checkpoints: list[Path] | Path | None = None,
                  dev_data: Path | None = None, dev_limit: int = 2000) -> dict[str, Any]:
    """Hashes (via load_manifest), fp32 parity (or consistency) for every set, variant agreement."""
    bundle_dir = Path(bundle_dir)
    manifest = load_manifest(bundle_dir)  # raises BundleError on bad hashes / version
    # which graph serves what: the parity and agreement checks below follow these routes
    result: dict[str, Any] = {"hashes": "ok", "routes": routes(manifest)}
    refs = None
    if checkpoints:
        places = [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints)
        refs = references_from_checkpoints(manifest, places, Vocab.load(bundle_dir / manifest["vocab"]))
        result["mode"], result["mode_reason"] = "parity_vs_checkpoints", "source checkpoints found by sha256"
    else:
        try:
            refs = references_from_bundle(bundle_dir, manifest)
            result["mode"] = "parity_vs_bundle_weights"
            result["mode_reason"] = (_how_to_get_checkpoint_parity(manifest) + "; this run rebuilt the "
                                     "PyTorch models from the bundle's own weights")
        except ModuleNotFoundError as exc:  # no torch: the service's environment
            result["mode"] = "internal_consistency"
            result["mode_reason"] = f"{exc.name} is not installed (the `train` extra has it); " \
                                    + _how_to_get_checkpoint_parity(manifest)
    sets: dict[str, Any] = {}
    passed = True
    if refs is not None:
        done: dict[str, dict] = {}
        for set_name, variant in available_variants(manifest):
            if variant == "fp32":
                report = check_parity(bundle_dir, manifest, refs, variant_files(manifest, set_name, variant),
                                      texts, done)
                sets.setdefault(set_name, {})[variant] = report
                passed &= all(g["passed"] for g in report.values())
    else:
        report = check_consistency(bundle_dir, manifest, texts)
        result["consistency"] = report
        passed &= all(g["passed"] for g in report.values())
    vocab = Vocab.load(bundle_dir / manifest["vocab"])
    data = None
    for set_name, variant in available_variants(manifest):
        if variant == "fp32":
            continue
        data = data or agreement_data(dev_data, vocab, dev_limit)
        agreement = variant_agreement(bundle_dir, manifest, set_name, variant, data)
        ok = meets_bars(agreement)
        sets.setdefault(set_name, {})[variant] = {"agreement_vs_fp32": agreement, "meets_bars": ok}
        if manifest["sets"][set_name].get("default_variant") == variant:
            passed &= ok
    # shipped graphs name no machine: a bundle whose nodes carry the build's file paths fails
    result["exporter_metadata"] = exporter_metadata(bundle_dir, manifest)
    passed &= not result["exporter_metadata"].get("files")
    result["route_fingerprints"] = fingerprint_check(bundle_dir, manifest)
    passed &= not result["route_fingerprints"].get("stale")
    result["sets"], result["passed"] = sets, bool(passed)
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `disan verify`."""
    parser.add_argument("bundle", type=Path, help="bundle directory (with manifest.json)")
    parser.add_argument("--checkpoints", type=Path, nargs="+", metavar="PATH",
                        help="the source checkpoints (.pt files or directories of them, found by the "
                        "sha256 in the manifest): parity against them")
    parser.add_argument("--dev-data", type=Path, help="staged data root (snli/dev.jsonl.gz, "
                        "sst/sst5_dev.jsonl.gz): variants' agreement and accuracy on the dev sets")
    parser.add_argument("--dev-limit", type=int, default=2000, help="dev examples per task")
    parser.add_argument("--update-manifest", action="store_true",
                        help="store the result under 'reverification' in manifest.json")


def run(args: argparse.Namespace) -> int:
    """Verify a bundle; print a JSON report; exit 0 if everything passed, 1 otherwise."""
    try:
        result = verify_bundle(args.bundle, checkpoints=args.checkpoints, dev_data=args.dev_data,
                               dev_limit=args.dev_limit)
    except BundleError as exc:
        print(f"disan verify: bundle rejected: {exc}")
        return 1
    print(json.dumps(result, indent=2))
    print("routes: " + ", ".join(f"{route} -> {graph}" for route, graph in result["routes"].items()))
    if args.update_manifest:
        manifest = load_manifest(args.bundle)
        manifest["reverification"] = result
        write_manifest(args.bundle, manifest)
    print(f"{'PASSED' if result['passed'] else 'FAILED'} ({result['mode']}: {result['mode_reason']})")
    return 0 if result["passed"] else 1
