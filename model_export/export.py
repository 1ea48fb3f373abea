"""`disan export --nli CKPT --sentiment CKPT --out DIR`: checkpoints -> verified ONNX bundle.

The bundle is built in a temporary sibling directory and moved into place only after every
graph passed `onnx.checker` and the ORT-vs-PyTorch parity check, so a failed export never
leaves a half-written bundle where the service would look for one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from disan.manifest import GRAPHS, MANIFEST_NAME, load_manifest, sha256_file, write_manifest
from disan.recipes import DEV_FILES
from disan.text import Vocab


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `disan export`."""
    parser.add_argument("--nli", required=True, type=Path, help="NLI checkpoint (.pt)")
    parser.add_argument("--sentiment", required=True, type=Path, help="sentiment checkpoint (.pt)")
    parser.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    parser.add_argument("--max-len", type=int, default=128, help="longest input the service accepts")
    parser.add_argument("--fp16", action="store_true", help="also write half-precision GPU graphs")
    parser.add_argument("--quantize", choices=["int8"], help="also write dynamically quantised graphs")
    parser.add_argument("--int8-embedding", choices=["int8", "fp32"], default="int8",
                        help="int8 variant: quantise the embedding table too (4x smaller) or keep fp32")
    parser.add_argument("--dev-data", type=Path, help="staged data root (snli/dev.jsonl.gz, "
                        "sst/sst5_dev.jsonl.gz) for the variants' agreement with fp32")
    parser.add_argument("--dev-limit", type=int, default=2000, help="dev examples per task for agreement")
    parser.add_argument("--explain", choices=["separate", "merged", "none"], default="separate",
                        help="explain outputs in their own graph, inside sentiment.onnx (smaller "
                        "bundle), or not at all")
    parser.add_argument("--force", action="store_true", help="replace an existing bundle in --out")
    parser.add_argument("--name", default="disan", help="model name the service reports (manifest `name`)")
    parser.add_argument("--attention-chunk-cells", type=int, default=None, metavar="N",
                        help="compute the token2token attention in query-row chunks of ~N pairs "
                        "(an ONNX Scan; default 1024, the fastest with 1 ORT thread per call, "
                        "bench/packing.py); "
                        "0: one unchunked tensor (as fast or faster with several intra-op threads)")


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a .jsonl or .jsonl.gz file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def agreement_data(dev_root: Path | None, vocab: Vocab, limit: int, seed: int = 1) -> dict[str, Any]:
    """Texts for variant agreement: staged dev sets if given, else generated word sequences."""
    if dev_root is not None:
        paths = {task: dev_root / rel for task, rel in DEV_FILES.items()}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise ValueError(f"--dev-data {dev_root}: missing {', '.join(missing)}")
        nli = read_jsonl(paths["nli"])[:limit]
        sst = read_jsonl(paths["sentiment"])[:limit]
        return {"source": f"dev sets: {paths['nli']} and {paths['sentiment']} (first {limit} rows each)",
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


def load_sources(nli_path: Path, sentiment_path: Path):
    """Load both checkpoints; refuse wrong tasks or different vocabularies with a clear message."""
    # torch/onnx load only once there is work: `disan export --help` and flag errors answer at once
    from disan.checkpoint import load_checkpoint, model_from_checkpoint

    payloads = {"nli": load_checkpoint(nli_path), "sentiment": load_checkpoint(sentiment_path)}
    loaded = {task: model_from_checkpoint(p) for task, p in payloads.items()}
    for task, path in (("nli", nli_path), ("sentiment", sentiment_path)):
        got = loaded[task][0].cfg.task
        if got != task:
            raise ValueError(f"{path}: is a '{got}' checkpoint, expected '{task}' for --{task}")
    v_nli, v_sent = loaded["nli"][1], loaded["sentiment"][1]
    if v_nli != v_sent:
        first = next((i for i, (a, b) in enumerate(zip(v_nli.itos, v_sent.itos, strict=False)) if a != b),
                     min(len(v_nli), len(v_sent)))
        raise ValueError(
            f"checkpoints use different vocabularies ({nli_path}: {len(v_nli)} words, {sentiment_path}: "
            f"{len(v_sent)} words, first difference at id {first}); the bundle has one vocab.json, "
            "so train both models with the same vocabulary")
    return payloads, loaded


def export_all(nli_model, sent_model, out: Path, fp16: bool, int8: bool, int8_embedding: bool,
               explain: str = "separate", log=print, chunk_cells: int | None = None
               ) -> dict[str, dict[str, Any]]:
    """Write every graph (and variants) into `out`; return the manifest's `graphs` section."""
    # torch and onnx: imported when exporting (see load_sources)
    from model_export.graphs import build_wrappers, export_fp32_graphs
    from model_export.onnx_files import check_onnx, convert_fp16, quantize_int8

    t0 = time.perf_counter()
    paths = export_fp32_graphs(nli_model, sent_model, out, {n: g.file for n, g in GRAPHS.items()}, explain,
                               chunk_cells)
    log(f"exported {len(set(paths.values()))} fp32 graphs in {time.perf_counter() - t0:.1f}s")
    wrappers = build_wrappers(nli_model, sent_model, explain)
    graphs: dict[str, dict[str, Any]] = {}
    done: dict[Path, dict[str, str]] = {}  # file -> its variants ('merged' shares one file)
    for name, path in paths.items():
        if path not in done:
            check_onnx(path)
            done[path] = {}
            if fp16:
                done[path]["fp16"] = check_and_name(
                    convert_fp16(path, out / path.name.replace(".onnx", ".fp16.onnx")), check_onnx)
            if int8:
                done[path]["int8"] = check_and_name(
                    quantize_int8(path, out / path.name.replace(".onnx", ".int8.onnx"), int8_embedding),
                    check_onnx)
        graphs[name] = {"file": path.name, "inputs": list(wrappers[name].input_names),
                        "outputs": list(wrappers[name].output_names),
                        "source": "sentiment" if name.startswith("sentiment") else "nli",
                        "labels": None, "precision": "fp32", "variants": dict(done[path])}
    return graphs


def check_and_name(path: Path, check) -> str:
    """Run `check` (onnx.checker) on a variant file and return its file name."""
    check(path)
    return path.name


def versions() -> dict[str, str]:
    """Library versions used for the export (recorded in the manifest)."""
    # torch and onnx: imported when exporting (see load_sources)
    import onnx
    import onnxruntime
    import torch

    from model_export.graphs import OPSET  # torch, as above

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(), "opset": OPSET}


def build_bundle(nli_path: Path, sentiment_path: Path, out: Path, max_len: int = 128, fp16: bool = False,
                 int8: bool = False, int8_embedding: bool = True, dev_data: Path | None = None,
                 dev_limit: int = 2000, force: bool = False, explain: str = "separate",
                 log=print, name: str = "disan", chunk_cells: int | None = None) -> dict[str, Any]:
    """Export, verify and atomically install a bundle at `out`; return its manifest."""
    # torch and onnx: imported when exporting (see load_sources)
    from model_export.graphs import ATTENTION_CHUNK_CELLS, build_wrappers, explain_mode
    from model_export.verify import check_parity, variant_agreement

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (force and (out / MANIFEST_NAME).is_file()):
        raise ValueError(f"{out}: exists and is not empty (use --force to replace an existing bundle)")
    if max_len < 1:
        raise ValueError(f"--max-len must be >= 1, got {max_len}")
    chunk_cells = ATTENTION_CHUNK_CELLS if chunk_cells is None else chunk_cells
    if chunk_cells < 0:
        raise ValueError(f"--attention-chunk-cells must be >= 0, got {chunk_cells}")
    payloads, loaded = load_sources(nli_path, sentiment_path)
    (nli_model, vocab, nli_labels), (sent_model, _, sent_labels) = loaded["nli"], loaded["sentiment"]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        explain = explain_mode(sent_model, explain)
        graphs = export_all(nli_model, sent_model, tmp, fp16, int8, int8_embedding, explain, log,
                            chunk_cells)
        for graph, entry in graphs.items():
            entry["labels"] = {"nli": nli_labels, "sentiment": sent_labels}.get(entry["source"]) \
                if graph != "encoder" else None
        vocab.save(tmp / "vocab.json")
        manifest: dict[str, Any] = {
            "name": name,  # the model name the service reports
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "vocab": "vocab.json", "vocab_size": len(vocab), "max_len": max_len,
            "embedding_dim": nli_model.encoder.out_dim, "word_embedding_dim": nli_model.cfg.embed_dim,
            "graphs": graphs, "explain": explain, "attention_chunk_cells": chunk_cells,
            "models": {task: {"config": payloads[task]["config"], "labels": loaded[task][2],
                              "metrics": payloads[task].get("metrics", {}),
                              "step": payloads[task].get("step"), "epoch": payloads[task].get("epoch")}
                       for task in ("nli", "sentiment")},
            "sources": {"nli": {"path": str(Path(nli_path).resolve()), "sha256": sha256_file(nli_path)},
                        "sentiment": {"path": str(Path(sentiment_path).resolve()),
                                      "sha256": sha256_file(sentiment_path)}},
            "versions": versions(),
        }
        write_manifest(tmp, manifest)  # hashes first, so the checks below see a complete bundle
        parity = check_parity(tmp, manifest, build_wrappers(nli_model, sent_model, explain))
        manifest["verification"] = {"mode": "parity_vs_pytorch", "device": "cpu", "tolerance": 1e-5,
                                    "graphs": parity, "passed": all(g["passed"] for g in parity.values())}
        variants: dict[str, Any] = {"fp32": {"files": sorted({g["file"] for g in graphs.values()}),
                                             "provider": "CPU or CUDA"}}
        wanted = [v for v, on in (("fp16", fp16), ("int8", int8)) if on]
        data = agreement_data(dev_data, vocab, dev_limit) if wanted else None
        for variant in wanted:
            variants[variant] = {"files": sorted({g["variants"][variant] for g in graphs.values()}),
                                 "agreement_vs_fp32": variant_agreement(tmp, manifest, variant, data)}
        if int8:
            variants["int8"]["embedding"] = "int8" if int8_embedding else "fp32"
        if fp16:
            variants["fp16"]["note"] = ("onnxruntime float16 converter on the fp32 graphs (keep_io_types): "
                                        "ids int64/mask bool in, float32 out; fp16 weights and "
                                        "activations; meant for the CUDA provider (slow on CPU)")
        manifest["variants"] = variants
        write_manifest(tmp, manifest)
        load_manifest(tmp)  # the service's own check must accept what we wrote
        if not manifest["verification"]["passed"]:
            failed = [n for n, g in parity.items() if not g["passed"]]
            raise ValueError(f"parity check failed for {failed}: {json.dumps(parity)}")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return manifest


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan export`."""
    manifest = build_bundle(args.nli, args.sentiment, args.out, args.max_len, args.fp16,
                            args.quantize == "int8", args.int8_embedding == "int8", args.dev_data,
                            args.dev_limit, args.force, args.explain, name=args.name,
                            chunk_cells=args.attention_chunk_cells)
    sizes = {p.name: p.stat().st_size for p in sorted(Path(args.out).iterdir())}
    for name, size in sizes.items():
        print(f"{size / 1e6:9.2f} MB  {name}")
    print(f"{sum(sizes.values()) / 1e6:9.2f} MB  total in {args.out}")
    for name, g in manifest["verification"]["graphs"].items():
        print(f"parity {name}: max |ORT - torch| = {g['max_abs_diff']:.2e}, labels identical: "
              f"{g['labels_identical']}")
    for variant, info in manifest["variants"].items():
        for name, agr in info.get("agreement_vs_fp32", {}).items():
            if isinstance(agr, dict):
                print(f"{variant} {name}: {agr}")
    return 0
