"""Checkpoints rebuilt from a bundle's graphs, for bundles whose checkpoints are gone.

    python -m model_export.recover BUNDLE OUT_DIR     # writes OUT_DIR/nli.pt, sentiment.pt (embed.pt)
    disan export --nli OUT_DIR/nli.pt --sentiment OUT_DIR/sentiment.pt --out NEW_BUNDLE

Format 2 (the current one): every initializer is named after the parameter it holds
(`<task>/<parameter>`, see model_export.graphs.weights), so each model the manifest lists is rebuilt
from its config and those weights, word-vector tables as stored (fp16 or int8 storage: the
values the bundle serves). A distilled encoder (`embed`) comes back over the bundle's vocabulary.

Format 1 held the whole NLI model in `nli.onnx` and the sentiment model in `sentiment.onnx` (or
`sentiment_explain.onnx`). Initializers named after a parameter are read by name; the others
(the exporter's `val_N`, e.g. transposed weights) are matched by use site against a probe export
of the same wrapper from a model with distinct random weights whose values identify every
parameter.

Either way the rebuilt models must reproduce the graphs (ORT vs PyTorch within 1e-5 on the
verify cases) or nothing is written.
"""

from __future__ import annotations

import argparse
import difflib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from disan.bundle.lineage import nested
from disan.bundle.manifest import (
    GRAPHS,
    GraphTokenizers,
    available_variants,
    read_manifest_json,
    sha256_file,
    variant_files,
    verify_files,
)
from disan.model import DiSANConfig, build_model
from disan.text.tokenizer import Vocab
from disan.train.checkpoint import save_checkpoint
from model_export.agreement import NLI
from model_export.graphs.weights import TRANSPOSED, name_by_parameters
from model_export.graphs.wrappers import NLIGraph, SentimentExplainGraph, SentimentGraph, export_graph
from model_export.references import bundle_models, load_state, references_from_models, storage_of
from model_export.sessions import session
from model_export.verify import FP32_TOL, check_parity, parity_cases

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
    for k, j in _aligned_nodes(model.graph, graph):
        node = model.graph.node[k]
        for slot, name in enumerate(node.input):
            theirs = graph.node[j].input[slot] if slot < len(graph.node[j].input) else None
            if not name.startswith(f"{task}/") or theirs not in old or tuple(old[theirs].dims) != dims[name]:
                continue
            key, arr = name.removeprefix(f"{task}/"), numpy_helper.to_array(old[theirs])
            if key.endswith(TRANSPOSED):
                key, arr = key.removesuffix(TRANSPOSED), arr.T
            found.setdefault(key, np.ascontiguousarray(arr))
    return found


def _aligned_nodes(probe: onnx.GraphProto, graph: onnx.GraphProto) -> list[tuple[int, int]]:
    """(probe node, old node) index pairs of the same computation step, aligned on op types:
    today's export adds nodes the old graphs lack (e.g. the UNK mapping of out-of-table ids
    before the embedding Gather), which would shift a plain position match."""
    ours = [n.op_type for n in probe.node]
    theirs = [n.op_type for n in graph.node]
    blocks = difflib.SequenceMatcher(None, ours, theirs, autojunk=False).get_matching_blocks()
    return [(b.a + i, b.b + i) for b in blocks for i in range(b.size)]


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


TRAINABLE_NOTE = ("trainable_rows (which embedding rows were trained; training only) is not in the "
                  "graphs: all True")


def recover(bundle_dir: Path, out_dir: Path, log=print) -> dict[str, Path]:
    """Write `out_dir`/<task>.pt for every model of a format-1 or format-2 bundle, rebuilt from its
    graphs, once every one reproduces them; return their paths."""
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest_json(bundle_dir)
    version = manifest.get("format_version")
    if version not in (1, 2):
        raise ValueError(f"{bundle_dir}: format version {version}, this tool reads versions 1 and 2")
    verify_files(bundle_dir, manifest)
    vocab = Vocab.load(bundle_dir / manifest.get("vocab", "vocab.json"))
    rebuilt = (_rebuild_v1 if version == 1 else _rebuild_v2)(bundle_dir, manifest, vocab, log)
    # what each model reads text through: the word vocabulary, or its graphs' tokenizer.json
    tokenizers = GraphTokenizers(bundle_dir, manifest, known={manifest.get("vocab", "vocab.json"): vocab})
    # written only now: a model that fails its check leaves no checkpoint of the others behind
    written: dict[str, Path] = {}
    for task, (model, labels, recovered_from) in rebuilt.items():
        info = manifest["models"][task]
        source = nested((manifest.get("sources") or {}).get(task) or {}, manifest.get("lineage") or {})
        recovered_from["original_checkpoint"] = {
            **source, "file": Path(str(source.get("path") or source.get("file") or "?")).name}
        recovered_from["original_checkpoint"].pop("path", None)  # format 1 recorded paths
        written[task] = Path(out_dir) / f"{task}.pt"
        reads = next((tokenizers(g) for g, e in manifest["graphs"].items() if graph_task(g, e) == task),
                     vocab)
        # how many words the encoder reads whole (the manifest's only record of it), so that an export
        # of the recovered encoder states it again
        whole = (info.get("borrowed") or {}).get("whole_words")
        save_checkpoint(written[task], model, reads, labels, metrics=info.get("metrics", {}),
                        step=info.get("step"), epoch=info.get("epoch"), recovered_from=recovered_from,
                        **({"whole_words": {"whole_words": whole}} if whole else {}))
    return written


def graph_task(graph: str, entry: dict[str, Any]) -> str:
    """The model a graph of the manifest belongs to: its "source", else its kind's task (a
    format-1 graph is named after its model)."""
    return entry.get("source") or (GRAPHS[graph].task if graph in GRAPHS else graph)


def _rebuild_v1(bundle_dir: Path, manifest: dict[str, Any], vocab: Vocab, log) -> dict[str, tuple]:
    """{task: (model, labels, provenance)} from a format-1 bundle's whole-model graphs."""
    out = {}
    for task in ("nli", "sentiment"):
        entry: dict[str, Any] = manifest["graphs"][task]
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
        out[task] = (model, entry.get("labels") or info["labels"], {
            "bundle_format_version": 1, "graph": {"file": entry["file"], "sha256": sha256_file(path)},
            "max_abs_diff_vs_graph": diff,
            "note": "weights read from the graph's initializers; " + TRAINABLE_NOTE})
    return out


def _rebuild_v2(bundle_dir: Path, manifest: dict[str, Any], vocab: Vocab, log) -> dict[str, tuple]:
    """{task: (model, labels, provenance)} from a format-2 bundle's parameter-named weights,
    checked as `disan verify` checks a bundle: every fp32 graph of every set, and NLI as served."""
    models = bundle_models(bundle_dir, manifest)
    refs = references_from_models(models["nli"], models["sentiment"], models.get("embed"))
    done: dict[str, dict] = {}
    reports = {s: check_parity(bundle_dir, manifest, refs, variant_files(manifest, s, v), done=done)
               for s, v in available_variants(manifest) if v == "fp32"}
    failed = sorted({f"{s}/{g}" for s, r in reports.items() for g, e in r.items() if not e["passed"]})
    worst = {g: max(r[g]["max_abs_diff"] for r in reports.values() if g in r)
             for g in {g for r in reports.values() for g in r}}
    for graph, diff in sorted(worst.items()):
        log(f"{graph}: max |ORT - rebuilt PyTorch| = {diff:.2e}")
    if failed:
        raise ValueError(f"{bundle_dir}: the rebuilt models do not reproduce {failed} (tolerance {FP32_TOL})")
    source = {g: graph_task(g, e) for g, e in manifest["graphs"].items()}
    fp32 = {f: g for s, v in available_variants(manifest) if v == "fp32"
            for g, f in variant_files(manifest, s, v).items()}
    out = {}
    for task, model in models.items():
        mine = sorted(f for f, g in fp32.items() if source.get(g) == task)
        labels = next((e["labels"] for g, e in manifest["graphs"].items() if source[g] == task
                       and e.get("labels")), manifest["models"][task].get("labels") or [])
        diffs = [worst[fp32[f]] for f in mine if fp32[f] in worst] + ([worst[NLI]] if task == "nli" else [])
        out[task] = (model, labels, {
            "bundle_format_version": 2, "bundle": manifest.get("name"),
            "graphs": {f: sha256_file(bundle_dir / f) for f in mine},
            "max_abs_diff_vs_graphs": max(diffs, default=0.0),
            "note": "weights read from the graphs' parameter-named initializers (word vectors as stored: "
                    f"{storage_of(manifest, task)}); " + TRAINABLE_NOTE})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export.recover",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="bundle directory (format 1 or 2)")
    parser.add_argument("out", type=Path, help="directory for nli.pt and sentiment.pt (and embed.pt)")
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
