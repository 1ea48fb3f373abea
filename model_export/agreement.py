"""Reduced-precision variants (fp16, int8) of a graph set against the set's fp32 graphs.

Label agreement (and accuracy against the gold labels) for probabilities, cosine for vectors,
on the staged dev sets (`--dev-data`) or on generated sentences; `meets_bars` says whether a
variant is usable at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.manifest import GRAPHS, GraphTokenizers, routes, variant_files
from disan.data.readers import read_jsonl
from disan.data.recipes import DEV_FILES
from disan.text.pieces import AnyTokenizer
from disan.text.tokenizer import Vocab
from model_export.sessions import run_graph, session, trim

NLI = "nli (encoder + nli_head)"  # report key of the composed NLI check (its route's encoder)
# A reduced-precision variant that misses these is broken (an overflow, a wrong op), not just
# imprecise: the set's default variant must meet them for `verify` to pass.
VARIANT_BARS = {"label_agreement": 0.95, "min_cosine": 0.99}


def agreement_data(dev_root: Path | None, vocab: Vocab, limit: int, seed: int = 1) -> dict[str, Any]:
    """Texts for variant agreement: staged dev sets if given, else generated word sequences."""
    if dev_root is not None:
        paths = {task: dev_root / rel for task, rel in DEV_FILES.items()}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise ValueError(f"--dev-data {dev_root}: missing {', '.join(missing)}")
        nli = read_jsonl(paths["nli"])[:limit]
        sst = read_jsonl(paths["sentiment"])[:limit]
        # named by the staged layout, never by this machine's paths
        return {"source": f"dev sets: {DEV_FILES['nli']} and {DEV_FILES['sentiment']} "
                          f"(first {limit} rows each)",
                "pairs": [(r["sentence1"], r["sentence2"]) for r in nli],
                "texts": [r["text"] for r in sst],
                # gold labels, so the manifest can state each variant's accuracy delta vs fp32
                "pair_labels": [str(r["gold_label"]) for r in nli],
                "text_labels": [int(r["label"]) for r in sst]}
    # No dev data: random vocabulary words, lengths 3..40. Weaker evidence than a dev set
    # (label agreement on near-uniform random inputs is pessimistic); the manifest says which.
    rng = np.random.default_rng(seed)
    words = vocab.itos[2:] or ["<unk>"]

    def sentence() -> str:
        return " ".join(words[i] for i in rng.integers(0, len(words), int(rng.integers(3, 41))))

    n = min(limit, 500)
    return {"source": f"generated: {n} random word sequences per task (no --dev-data given)",
            "pairs": [(sentence(), sentence()) for _ in range(n)], "texts": [sentence() for _ in range(n)]}


def _run_rows(sess, graph: str, vocab: AnyTokenizer, texts: list[str], max_len: int, size: int = 64
              ) -> list[list[np.ndarray]]:
    """Every output of a sentence graph per text (token axes cut to the text), in input order."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding per batch
    out: list[list[np.ndarray]] = [[] for _ in texts]
    for s in range(0, len(order), size):
        idx = order[s: s + size]
        enc = vocab.encode([texts[i] for i in idx], max_len=max_len)
        res = run_graph(sess, graph, enc.ids, enc.mask)
        for j, i in enumerate(idx):
            n = int(enc.mask[j].sum())
            out[i] = [trim(name, r[j], n) for name, r in zip(GRAPHS[graph].outputs, res, strict=True)]
    return out


def _agreement(ref: np.ndarray, got: np.ndarray, probs: bool, gold: np.ndarray | None = None
               ) -> dict[str, Any]:
    """Label agreement (+ accuracy vs gold) for probabilities, cosine for vectors."""
    entry: dict[str, Any] = {"n": len(ref), "finite": bool(np.isfinite(got).all())}
    if probs:
        entry["label_agreement"] = float((got.argmax(-1) == ref.argmax(-1)).mean())
        if gold is not None:
            acc_ref, acc = float((ref.argmax(-1) == gold).mean()), float((got.argmax(-1) == gold).mean())
            entry.update(accuracy_fp32=acc_ref, accuracy=acc, accuracy_delta=acc - acc_ref)
    else:
        cos = (got * ref).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1) + 1e-12)
        entry["min_cosine"], entry["mean_cosine"] = float(cos.min()), float(cos.mean())
    return entry


def variant_agreement(bundle_dir: Path, manifest: dict[str, Any], set_name: str, variant: str,
                      data: dict[str, Any]) -> dict[str, Any]:
    """A variant of a set vs the set's fp32 graphs: each sentence graph on the sentiment texts
    (first output: labels or cosine; every output: max |diff|), and NLI as served on the pairs."""
    reader = GraphTokenizers(bundle_dir, manifest)  # the word vocabulary, or a graph's piece tokenizer
    max_len = manifest["max_len"]
    ref_files, files = variant_files(manifest, set_name, "fp32"), variant_files(manifest, set_name, variant)
    report: dict[str, Any] = {"data": data["source"]}
    gold_texts = np.array(data["text_labels"]) if "text_labels" in data else None
    for graph, file in files.items():
        if graph == "nli_head" or graph not in ref_files:
            continue
        ref = _run_rows(session(bundle_dir / ref_files[graph]), graph, reader(graph), data["texts"], max_len)
        got = _run_rows(session(bundle_dir / file), graph, reader(graph), data["texts"], max_len)
        probs = GRAPHS[graph].outputs[0] == "probs"
        entry = _agreement(np.stack([r[0] for r in ref]), np.stack([g[0] for g in got]), probs,
                           gold_texts if probs else None)
        entry["max_abs_diff"] = max(float(np.abs(a - b).max()) for r, g in zip(ref, got, strict=True)
                                    for a, b in zip(r, g, strict=True))
        report[graph] = entry
    labels = manifest["graphs"]["nli_head"].get("labels")
    gold = (np.array([labels.index(lab) if lab in labels else -1 for lab in data["pair_labels"]])
            if "pair_labels" in data and labels else None)
    nli_probs = []
    encoder = routes(manifest)["nli"]  # the NLI model's encoder feeds the head
    for names in (ref_files, files):
        enc, head = session(bundle_dir / names[encoder]), session(bundle_dir / names["nli_head"])
        u = np.stack([r[0] for r in _run_rows(enc, encoder, reader(encoder), [p for p, _ in data["pairs"]],
                                              max_len)])
        v = np.stack([r[0] for r in _run_rows(enc, encoder, reader(encoder), [h for _, h in data["pairs"]],
                                              max_len)])
        nli_probs.append(run_graph(head, "nli_head", u, v)[0])
    report[NLI] = _agreement(nli_probs[0], nli_probs[1], True, gold)
    report[NLI]["max_abs_diff"] = float(np.abs(nli_probs[0] - nli_probs[1]).max())
    return report


def meets_bars(report: dict[str, Any]) -> bool:
    """Whether every graph of a variant agreement report meets VARIANT_BARS and is finite."""
    entries = [e for k, e in report.items() if isinstance(e, dict)]
    return all(e.get("finite", True) and all(e.get(k, bar) >= bar for k, bar in VARIANT_BARS.items())
               for e in entries)
