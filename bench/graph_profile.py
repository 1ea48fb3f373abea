"""Where one bundle graph spends its time: onnxruntime's node profile, by operator and by node.

    python -m bench.graph_profile --bundle models/default --graph encoder [--batch 64] [--runs 50]

Runs the graph a graph set serves (`--set cpu`: the CPU server's file, e.g. the chunked
encoder) `--runs` times on one batch of real sentences of one length bucket (the offline
benchmark's; `--lengths 11-25` are SNLI lengths) with onnxruntime's profiler on, and sums each
node's kernel time once (a Scan's steps count as their nodes, the Scan as its own overhead). A
node group is the nodes whose name starts with a prefix (`--group embedding=node_embedding`):
the share of, say, the word-table lookup in the whole graph.
Shares, not absolute times, are what carry from one machine to another.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort

from bench.offline import BUCKETS, load_sentences
from bench.report import run_and_report
from disan.bundle.manifest import graph_tokenizer, load_manifest
from disan.text.pieces import read_tokenizer

TOP_NODES = 15
KERNEL = "_kernel_time"
LENGTHS = [f"{lo}-{hi}" for lo, hi in BUCKETS]  # the offline benchmark's length buckets


def graph_feed(bundle: Path, manifest: dict, graph: str, sentences: list[str]) -> dict:
    """The graph's inputs for `sentences`, read through the tokenizer that graph reads (the word
    vocabulary, or the subword tokenizer.json the manifest names for it), as the service reads them."""
    batch = read_tokenizer(bundle / graph_tokenizer(manifest, graph)).encode(sentences)
    return {"ids": batch.ids, "mask": batch.mask}


def profile(graph: Path, feed: dict, runs: int, threads: int) -> list[dict]:
    """The node events of `runs` runs, after a warm-up run that is left out (it allocates)."""
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    calls = sorted((e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"),
                   key=lambda e: e["ts"])
    warm_up_end = calls[0]["ts"] + calls[0]["dur"]
    return [e for e in events
            if e.get("cat") == "Node" and e["name"].endswith(KERNEL) and e["ts"] >= warm_up_end]


def body_owners(graph: onnx.GraphProto) -> dict[str, str]:
    """Each node inside a control-flow node's body (a Scan's step) -> the name of that node; at
    any depth, each to its direct owner."""
    owners = {}
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                owners |= {inner.name: node.name for inner in attr.g.node} | body_owners(attr.g)
    return owners


def leaf_times(events: list[dict], graph_file: Path) -> tuple[Counter, Counter]:
    """Kernel time by node and by operator, each microsecond counted once.

    The profiler reports a Scan's body nodes and also the Scan itself, whose time includes them:
    the body nodes stay, and the control-flow node keeps only its own time (the loop's overhead)."""
    owners = body_owners(onnx.load(str(graph_file), load_external_data=False).graph)
    by_node, by_op, op_of = Counter(), Counter(), {}
    for e in events:
        name, op = e["name"][: -len(KERNEL)], e["args"]["op_name"]
        by_node[name] += e["dur"]
        by_op[op] += e["dur"]
        op_of[name] = op
    for name, owner in owners.items():
        if name in by_node and owner in by_node:
            by_node[owner] -= by_node[name]
            by_op[op_of[owner]] -= by_node[name]
    return by_node, by_op


def run(args: argparse.Namespace) -> dict:
    manifest = load_manifest(args.bundle)
    if args.graph not in manifest["graphs"]:
        raise ValueError(f"--graph {args.graph!r}: the bundle has {', '.join(manifest['graphs'])}")
    if set(manifest["graphs"][args.graph]["inputs"]) != {"ids", "mask"}:
        raise ValueError(f"--graph {args.graph!r} does not read texts (inputs ids, mask)")
    spec = args.group or ["embedding=node_embedding"]
    if any("=" not in g for g in spec):
        raise ValueError(f"--group {spec}: give NAME=PREFIX")
    groups = dict(g.split("=", 1) for g in spec)
    if args.set not in manifest["sets"]:
        raise ValueError(f"--set {args.set!r}: the bundle has {', '.join(manifest['sets'])}")
    graph_set = manifest["sets"][args.set]
    graph_file = graph_set["variants"][graph_set["default_variant"]]["files"][args.graph]  # what is served
    sentences = load_sentences(args.data, args.batch)[args.lengths]
    feed = graph_feed(args.bundle, manifest, args.graph, sentences)
    events = profile(args.bundle / graph_file, feed, args.runs, args.threads)
    by_node, by_op = leaf_times(events, args.bundle / graph_file)
    total = sum(by_node.values())

    def share(us: float) -> float:
        return round(100 * us / total, 2)

    return {"bundle": str(args.bundle), "graph": args.graph, "file": graph_file, "lengths": args.lengths,
            "batch": list(feed["ids"].shape),
            "threads": args.threads, "runs": args.runs,
            "microseconds_per_run": round(total / args.runs, 1),
            "by_operator": {op: share(us) for op, us in by_op.most_common()},
            "top_nodes": {n: share(us) for n, us in by_node.most_common(TOP_NODES)},
            "groups": {name: share(sum(us for n, us in by_node.items() if n.startswith(prefix)))
                       for name, prefix in groups.items()}}


def markdown(results: dict) -> str:
    rows, width = results["batch"]
    lines = [f"{results['graph']} ({results['file']}), batch {rows} x {width} tokens, "
             f"{results['threads']} thread(s): {results['microseconds_per_run']:.0f} us a run", "",
             "| share of node time (%) | |", "| --- | --- |"]
    lines += [f"| group {n} | {s:.2f} |" for n, s in results["groups"].items()]
    lines += [f"| {op} | {s:.2f} |" for op, s in list(results["by_operator"].items())[:10]]
    return "\n".join(lines)


def positive(text: str) -> int:
    """argparse type: a whole number of at least 1 (no run, batch or thread: nothing to profile)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--graph", default="encoder")
    parser.add_argument("--set", default="cpu", help="the manifest's graph set whose default variant is run "
                        "(on the CPU provider whatever the set)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--batch", type=positive, default=64, help="sentences in the one batch")
    parser.add_argument("--lengths", default="11-25", choices=LENGTHS,
                        help="the offline benchmark's length bucket")
    parser.add_argument("--runs", type=positive, default=50)
    parser.add_argument("--threads", type=positive, default=1)
    parser.add_argument("--group", action="append", metavar="NAME=PREFIX",
                        help="nodes whose names start with PREFIX, summed "
                             "(default: embedding=node_embedding, the word-table lookup)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/graph_profile.json"))
    return run_and_report(parser, run, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
