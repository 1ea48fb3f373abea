"""Checkpoints rebuilt from a format-1 bundle's graphs, for bundles whose checkpoints are gone.

    python -m model_export.recover OLD_BUNDLE OUT_DIR     # writes OUT_DIR/nli.pt, sentiment.pt
    disan export --nli OUT_DIR/nli.pt --sentiment OUT_DIR/sentiment.pt --out NEW_BUNDLE

A format-1 bundle holds the whole NLI model in `nli.onnx` and the sentiment model in
`sentiment.onnx` (or `sentiment_explain.onnx`); the manifest holds their configs, labels and
metrics. Each PyTorch model is rebuilt from its config and the graph's initializers: those
named after a parameter are read by name; the others (the exporter's `val_N`, e.g. transposed
weights) are matched by position, against a probe export of the same wrapper from a model with
distinct random weights whose values identify every parameter. The rebuilt model must then
reproduce the old graph (ORT vs PyTorch within 1e-5 on the verify cases) or nothing is written.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from disan.checkpoint import save_checkpoint
from disan.manifest import read_manifest_json, sha256_file, verify_files
from disan.model import DiSANConfig, build_model
from disan.text import Vocab
from model_export.graphs import NLIGraph, SentimentExplainGraph, SentimentGraph, export_graph
from model_export.sessions import session
from model_export.verify import FP32_TOL, load_state, parity_cases
from model_export.weights import TRANSPOSED, name_by_parameters

PREFIX = "model."  # the wrappers of format-1 graphs hold the model as `self.model`


def _wrapper(task: str, model, outputs: list[str]):
    if task == "nli":
        return NLIGraph(model)
    return (SentimentExplainGraph if len(outputs) > 1 else SentimentGraph)(model)


def weights_from_graph(path: Path, task: str, cfg: DiSANConfig, outputs: list[str], chunk_cells: int
                       ) -> dict[str, np.ndarray]:
    """State-dict arrays of `task`'s model read from a format-1 graph (see the module docstring)."""
    graph = onnx.load(str(path)).graph
    keys = {k for k in build_model(cfg).state_dict() if not k.endswith("trainable_rows")}
    found = {}
    for init in graph.initializer:
        key = init.name.removeprefix(PREFIX)
        if init.data_type == TensorProto.FLOAT and key in keys:
            found[key] = numpy_helper.to_array(init)
    if keys - set(found):
        for key, arr in _probe(graph, task, cfg, outputs, chunk_cells).items():
            found.setdefault(key, arr)
    return found


def _probe(graph: onnx.GraphProto, task: str, cfg: DiSANConfig, outputs: list[str], chunk_cells: int
           ) -> dict[str, np.ndarray]:
    """Parameters read where a probe export of the same wrapper reads them.

    The probe model has distinct random weights, so each of its initializers names exactly one
    parameter (name_by_parameters); the old graph's initializer at the same use (node position,
    op type, input slot) holds that parameter's value. Use sites rather than initializers, so
    constants the exporter merged (equal parameters, e.g. two zero biases) are found for each.
    """
    gen = torch.Generator().manual_seed(0)
    probe = build_model(cfg).eval()
    with torch.no_grad():
        for p in probe.parameters():  # distinct values: no two parameters are equal
            p.copy_(torch.randn(p.shape, generator=gen))
    probe.encoder.chunk_cells = chunk_cells
    with tempfile.TemporaryDirectory() as tmp:
        model = onnx.load(str(export_graph(_wrapper(task, probe, outputs), Path(tmp) / "probe.onnx",
                                           cfg.vocab_size)))
    name_by_parameters(model, task, {k: v.detach().numpy() for k, v in probe.state_dict().items()},
                       prefixes=(PREFIX,))
    old = {init.name: init for init in graph.initializer if init.data_type == TensorProto.FLOAT}
    dims = {init.name: tuple(init.dims) for init in model.graph.initializer}
    found: dict[str, np.ndarray] = {}
    for k, node in enumerate(model.graph.node):
        if k >= len(graph.node) or graph.node[k].op_type != node.op_type:
            continue
        for slot, name in enumerate(node.input):
            theirs = graph.node[k].input[slot] if slot < len(graph.node[k].input) else None
            if not name.startswith(f"{task}/") or theirs not in old or tuple(old[theirs].dims) != dims[name]:
                continue
            key, arr = name.removeprefix(f"{task}/"), numpy_helper.to_array(old[theirs])
            if key.endswith(TRANSPOSED):
                key, arr = key.removesuffix(TRANSPOSED), arr.T
            found.setdefault(key, np.ascontiguousarray(arr))
    return found


def graph_parity(path: Path, wrapper, vocab: Vocab, max_len: int) -> float:
    """max |ORT - PyTorch| of a format-1 graph and the rebuilt model over the verify cases."""
    sess = session(path)
    names = [i.name for i in sess.get_inputs()]
    cases = parity_cases(vocab, max_len)
    worst = 0.0
    for k, case in enumerate(cases):
        other = cases[-1 - k].tiled(case.ids.shape[0])
        arrays = [case.ids, case.mask, other.ids, other.mask][: len(names)]
        got = sess.run(None, dict(zip(names, arrays, strict=True)))
        with torch.no_grad():
            want = wrapper(*(torch.from_numpy(a) for a in arrays))
        want = want if isinstance(want, tuple) else (want,)
        worst = max(worst, *(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want, strict=True)))
    return worst


def recover(bundle_dir: Path, out_dir: Path, log=print) -> dict[str, Path]:
    """Write `out_dir`/nli.pt and sentiment.pt rebuilt from a format-1 bundle; return their paths."""
    bundle_dir, out_dir = Path(bundle_dir), Path(out_dir)
    manifest = read_manifest_json(bundle_dir)
    if manifest.get("format_version") != 1:
        raise ValueError(f"{bundle_dir}: format version {manifest.get('format_version')}, this tool "
                         "converts version 1 (newer bundles carry parameter-named weights: `disan verify`)")
    verify_files(bundle_dir, manifest)
    vocab = Vocab.load(bundle_dir / manifest.get("vocab", "vocab.json"))
    graphs = manifest["graphs"]
    written: dict[str, Path] = {}
    for task, graph_name in (("nli", "nli"), ("sentiment", "sentiment")):
        entry: dict[str, Any] = graphs[graph_name]
        info = manifest["models"][task]
        cfg = DiSANConfig.from_dict(info["config"])
        path = bundle_dir / entry["file"]
        model = build_model(cfg).eval()
        load_state(model, weights_from_graph(path, task, cfg, entry["outputs"],
                                             int(manifest.get("attention_chunk_cells") or 0)), task)
        diff = graph_parity(path, _wrapper(task, model, entry["outputs"]).eval(), vocab, manifest["max_len"])
        log(f"{task}: rebuilt from {entry['file']}: max |ORT - PyTorch| = {diff:.2e}")
        if not diff <= FP32_TOL:
            raise ValueError(f"{path}: the rebuilt {task} model does not reproduce the graph "
                             f"(max |diff| {diff:.2e} > {FP32_TOL})")
        source = (manifest.get("sources") or {}).get(task) or {}
        recovered_from = {
            "bundle_format_version": 1, "graph": {"file": entry["file"], "sha256": sha256_file(path)},
            "original_checkpoint": {"file": Path(str(source.get("path") or source.get("file") or "?")).name,
                                    "sha256": source.get("sha256")},
            "max_abs_diff_vs_graph": diff,
            "note": "weights read from the graph's initializers; trainable_rows (which embedding "
                    "rows were trained; training only) is not in the graph: all True",
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        written[task] = out_dir / f"{task}.pt"
        save_checkpoint(written[task], model, vocab, entry.get("labels") or info["labels"],
                        metrics=info.get("metrics", {}), step=info.get("step"), epoch=info.get("epoch"),
                        recovered_from=recovered_from)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export.recover",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="format-1 bundle directory")
    parser.add_argument("out", type=Path, help="directory for nli.pt and sentiment.pt")
    args = parser.parse_args(argv)
    try:
        for task, path in recover(args.bundle, args.out).items():
            print(f"{task}: {path} (sha256 {sha256_file(path)})")
    except ValueError as exc:
        print(f"recover: error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
