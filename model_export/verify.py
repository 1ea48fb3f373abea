"""`disan verify DIR`: check a bundle's hashes and its graphs against PyTorch (or itself).

Parity cases: random-id and real-sentence batches at lengths 1, 2, 7, 33, 100 (capped at the
bundle's max_len) and batch sizes 1 and 16; batch-16 rows get mixed lengths (padding), with one
row at full length. fp32 graphs must match PyTorch within 1e-5 and predict identical labels.

When the source checkpoints recorded in the manifest are gone (or changed), `verify` falls back
to internal consistency: each row of a padded batch must equal the same text run alone, the
explain graph must agree with sentiment.onnx, and variants are compared with fp32.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from disan.manifest import BundleError, load_manifest, sha256_file, write_manifest
from disan.text import Vocab

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


def token_stream(vocab: Vocab, texts: list[str]) -> list[int]:
    """All texts' token ids concatenated (UNKs included): the pool real-sentence cases cut from."""
    return [i for t in texts for i in vocab.text_ids(t)]


def parity_cases(vocab: Vocab, max_len: int, texts: list[str] | None = None, seed: int = 0) -> list[Case]:
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


def feeds_for(graph: dict[str, Any], case: Case, other: Case | None = None) -> dict[str, np.ndarray]:
    """Input dict for a graph: (ids, mask) or the NLI premise/hypothesis quadruple."""
    names = graph["inputs"]
    if len(names) == 2:
        return {names[0]: case.ids, names[1]: case.mask}
    hyp = other or case
    if hyp.ids.shape[0] != case.ids.shape[0]:  # hypotheses must match the premise batch size
        reps = -(-case.ids.shape[0] // hyp.ids.shape[0])
        hyp = Case(hyp.name, np.tile(hyp.ids, (reps, 1))[: case.ids.shape[0]],
                   np.tile(hyp.mask, (reps, 1))[: case.ids.shape[0]])
    return {names[0]: case.ids, names[1]: case.mask, names[2]: hyp.ids, names[3]: hyp.mask}


def session(path: Path):
    """A CPU onnxruntime session (verification is always done on CPU, single-threaded)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _torch_outputs(module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import torch  # only the parity mode needs torch (see load_references)

    with torch.no_grad():
        out = module(*(torch.from_numpy(v) for v in feeds.values()))
    out = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in out]


def check_parity(bundle_dir: Path, manifest: dict[str, Any], references: dict[str, Any],
                 texts: list[str] | None = None) -> dict[str, Any]:
    """ORT (CPU) vs PyTorch for every fp32 graph over all parity cases."""
    vocab = Vocab.load(bundle_dir / manifest["vocab"])
    cases = parity_cases(vocab, manifest["max_len"], texts)
    report: dict[str, Any] = {}
    for name, graph in manifest["graphs"].items():
        if name not in references:
            continue
        sess = session(bundle_dir / graph["file"])
        worst, labels_ok, finite = 0.0, True, True
        for k, case in enumerate(cases):
            feeds = feeds_for(graph, case, cases[-1 - k])
            got = sess.run(None, feeds)
            want = _torch_outputs(references[name], feeds)
            for g, w in zip(got, want, strict=True):
                finite &= bool(np.isfinite(g).all())
                worst = max(worst, float(np.abs(g - w).max()) if g.size else 0.0)
            if graph["outputs"][0] == "probs":
                labels_ok &= bool((got[0].argmax(-1) == want[0].argmax(-1)).all())
        report[name] = {"max_abs_diff": worst, "labels_identical": labels_ok, "finite": finite,
                        "cases": len(cases), "passed": worst <= FP32_TOL and labels_ok and finite}
    return report


def check_consistency(bundle_dir: Path, manifest: dict[str, Any], texts: list[str] | None = None
                      ) -> dict[str, Any]:
    """Without PyTorch: padded-batch rows vs the same rows alone, explain vs sentiment probs."""
    vocab = Vocab.load(bundle_dir / manifest["vocab"])
    cases = [c for c in parity_cases(vocab, manifest["max_len"], texts) if c.ids.shape[0] > 1]
    report: dict[str, Any] = {}
    for name, graph in manifest["graphs"].items():
        sess = session(bundle_dir / graph["file"])
        worst = 0.0
        for case in cases:
            batch_out = sess.run(None, feeds_for(graph, case))[0]
            for r in range(0, case.ids.shape[0], 5):  # a few rows each: keeps verify quick
                n = int(case.mask[r].sum())
                alone = Case(case.name, case.ids[r: r + 1, :n], case.mask[r: r + 1, :n])
                out = sess.run(None, feeds_for(graph, alone))[0]
                ref = batch_out[r: r + 1]
                if out.shape != ref.shape:  # explain maps [1,n,n] vs padded [1,N,N]: crop
                    ref = ref[(slice(None),) + tuple(slice(0, s) for s in out.shape[1:])]
                worst = max(worst, float(np.abs(out - ref).max()))
        report[name] = {"padding_invariance_max_abs_diff": worst, "passed": worst <= FP32_TOL}
    if "sentiment_explain" in manifest["graphs"]:
        a = session(bundle_dir / manifest["graphs"]["sentiment"]["file"])
        b = session(bundle_dir / manifest["graphs"]["sentiment_explain"]["file"])
        diff = max(float(np.abs(a.run(["probs"], {"ids": c.ids, "mask": c.mask})[0]
                                - b.run(["probs"], {"ids": c.ids, "mask": c.mask})[0]).max())
                   for c in cases)
        report["sentiment_explain"]["probs_vs_sentiment_max_abs_diff"] = diff
        report["sentiment_explain"]["passed"] &= diff <= FP32_TOL
    return report


def _batches(vocab: Vocab, texts: list[str], max_len: int, size: int = 64):
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding per batch
    for s in range(0, len(order), size):
        idx = order[s: s + size]
        yield idx, vocab.encode([texts[i] for i in idx], max_len=max_len)


def _run_all(sess, graph: dict[str, Any], vocab: Vocab, data: dict[str, list], max_len: int) -> np.ndarray:
    """First output of a graph over the whole agreement set, in the original order."""
    texts = data["pairs"] if len(graph["inputs"]) == 4 else data["texts"]
    out: list[np.ndarray | None] = [None] * len(texts)
    if len(graph["inputs"]) == 4:
        prem = [p for p, _ in texts]
        for idx, enc in _batches(vocab, prem, max_len):
            hyp = vocab.encode([texts[i][1] for i in idx], max_len=max_len)
            res = sess.run(None, feeds_for(graph, Case("", enc.ids, enc.mask), Case("", hyp.ids, hyp.mask)))
            for j, i in enumerate(idx):
                out[i] = res[0][j]
    else:
        for idx, enc in _batches(vocab, texts, max_len):
            res = sess.run(None, feeds_for(graph, Case("", enc.ids, enc.mask)))
            for j, i in enumerate(idx):
                out[i] = res[0][j]
    return np.stack(out)


def _gold_indices(name: str, graph: dict[str, Any], data: dict[str, Any]) -> np.ndarray | None:
    """Gold label ids for a probs graph's dev rows, if the agreement data carries labels."""
    if name == "nli" and "pair_labels" in data:
        return np.array([graph["labels"].index(lab) for lab in data["pair_labels"]])
    if name.startswith("sentiment") and "text_labels" in data:
        return np.array(data["text_labels"])
    return None


def variant_agreement(bundle_dir: Path, manifest: dict[str, Any], variant: str,
                      data: dict[str, Any]) -> dict[str, Any]:
    """Label agreement (probs graphs) or cosine similarity (encoder) of a variant vs fp32."""
    vocab = Vocab.load(bundle_dir / manifest["vocab"])
    report: dict[str, Any] = {"data": data["source"]}
    for name, graph in manifest["graphs"].items():
        file = graph.get("variants", {}).get(variant)
        if not file:
            continue
        try:
            ref = _run_all(session(bundle_dir / graph["file"]), graph, vocab, data, manifest["max_len"])
            got = _run_all(session(bundle_dir / file), graph, vocab, data, manifest["max_len"])
        except Exception as exc:  # e.g. an fp16 op with no CPU kernel: record it, keep going
            report[name] = {"error": f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:300]}"}
            continue
        entry: dict[str, Any] = {"n": len(ref), "max_abs_diff": float(np.abs(got - ref).max())}
        if graph["outputs"][0] == "probs":
            entry["label_agreement"] = float((got.argmax(-1) == ref.argmax(-1)).mean())
            gold = _gold_indices(name, graph, data)
            if gold is not None:
                acc_ref = float((ref.argmax(-1) == gold).mean())
                acc_got = float((got.argmax(-1) == gold).mean())
                entry.update(accuracy_fp32=acc_ref, accuracy=acc_got, accuracy_delta=acc_got - acc_ref)
        else:
            cos = (got * ref).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1) + 1e-12)
            entry["min_cosine"], entry["mean_cosine"] = float(cos.min()), float(cos.mean())
        report[name] = entry
    return report


def load_references(manifest: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Wrappers rebuilt from the source checkpoints named in the manifest, or (None, why not)."""
    sources = manifest.get("sources", {})
    for task in ("nli", "sentiment"):
        src = sources.get(task, {})
        path = Path(src.get("path", ""))
        if not src.get("path") or not path.is_file():
            return None, f"source checkpoint for {task} not found ({src.get('path')})"
        if sha256_file(path) != src.get("sha256"):
            return None, f"source checkpoint {path} changed since export (sha256 differs)"
    # torch: only the parity mode needs it (`disan verify` checks consistency without torch)
    from disan.checkpoint import load_checkpoint, model_from_checkpoint
    from model_export.graphs import build_wrappers

    nli, _, _ = model_from_checkpoint(load_checkpoint(sources["nli"]["path"]))
    sent, _, _ = model_from_checkpoint(load_checkpoint(sources["sentiment"]["path"]))
    explain = manifest.get("explain", "separate")
    return build_wrappers(nli, sent, explain), "source checkpoints found, sha256 match"


def verify_bundle(bundle_dir: str | Path, texts: list[str] | None = None) -> dict[str, Any]:
    """Hashes (via load_manifest), then parity vs PyTorch if the sources exist, else consistency."""
    bundle_dir = Path(bundle_dir)
    manifest = load_manifest(bundle_dir)  # raises BundleError on bad hashes / version
    result: dict[str, Any] = {"hashes": "ok"}
    refs, why = load_references(manifest)
    result["mode"] = "parity_vs_pytorch" if refs else "internal_consistency"
    result["mode_reason"] = why
    result["graphs"] = (check_parity(bundle_dir, manifest, refs, texts) if refs
                        else check_consistency(bundle_dir, manifest, texts))
    result["passed"] = all(g["passed"] for g in result["graphs"].values())
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `disan verify`."""
    parser.add_argument("bundle", type=Path, help="bundle directory (with manifest.json)")
    parser.add_argument("--update-manifest", action="store_true",
                        help="store the result under 'reverification' in manifest.json")


def run(args: argparse.Namespace) -> int:
    """Verify a bundle; print a JSON report; exit 0 if everything passed, 1 otherwise."""

    try:
        result = verify_bundle(args.bundle)
    except BundleError as exc:
        print(f"disan verify: bundle rejected: {exc}")
        return 1
    print(json.dumps(result, indent=2))
    if args.update_manifest:
        manifest = load_manifest(args.bundle)
        manifest["reverification"] = result
        write_manifest(args.bundle, manifest)
    print(f"{'PASSED' if result['passed'] else 'FAILED'} ({result['mode']}: {result['mode_reason']})")
    return 0 if result["passed"] else 1
