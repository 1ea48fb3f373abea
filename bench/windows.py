"""Long texts: the cost of the window size and the quality of windowed vectors (one run, CPU).

    python -m bench.windows --bundle models/default --data ../shared/data [--json bench/results/windows.json]

Three measurements, all through `disan.runtime.runtime` (the service's graphs) and `disan.text.windowing`
(the service's cuts and pooling):

1. Cost of `max_tokens` W in 128 / 256 / 512: each W in a fresh process (so its peak memory is
   its own) on the cpu graph set (query-chunked attention) and, for comparison, the gpu set's
   unchunked fp32 graph run on the CPU. One single-threaded onnxruntime call per window (the
   service's CPU layout: one call per core; at its 4,096-cell budget a window of 64+ tokens is a
   call of its own). Reported: ms per window of W tokens (median of --repeats), ms for a
   5,000-token document cut into W windows, and the peak memory one window adds over the loaded
   runtime (ru_maxrss after the window minus after loading and a 1-token call).
2. Agreement with the whole text where both fit: texts of 200 / 300 / 500 tokens embedded whole
   (one row, the graphs take any length) and windowed at W (no overlap and 25% overlap) or
   truncated to W: mean and min cosine to the whole-text vector.
3. Retrieval of a document from one of its paragraphs: pseudo-documents of 200-1,500 tokens made
   of consecutive distinct premises of MultiNLI dev-matched and SNLI dev (one source per
   document); a query is 4 consecutive premises of a document, taken either verbatim or as the
   4 entailed hypotheses written for them (a paraphrase). Each document is embedded windowed at
   W or truncated to W; top-1 accuracy and MRR of the right document among all documents, and
   top-1 for queries whose paragraph starts past the first 128 tokens (what truncation loses).

4. STS on the longer staged texts: the STS Benchmark pairs (train + dev) whose longer sentence has
   more than 24 tokens, scored by cosine with each sentence whole, windowed at W = 8 / 16 or
   truncated to W: Spearman correlation with the gold scores (windows much shorter than the
   sentence, as 128 is next to a document of a few hundred tokens).

The documents are synthetic (the staged data has no long texts): they test whether a pooled
vector keeps each part's content, not topical coherence.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.report import run_and_report
from disan.data.readers import read_jsonl
from disan.runtime.runtime import Runtime, load_offline
from disan.text.tokenizer import tokenize
from disan.text.windowing import pool_windows, split_windows

WINDOWS = (128, 256, 512)
DOC_TOKENS = 5000
SOURCES = ("mnli/dev_matched.jsonl.gz", "snli/dev.jsonl.gz")
GRAPH_SETS = {"cpu": ("cpu", "auto"), "gpu-fp32-on-cpu": ("gpu", "fp32")}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cost_one(bundle: str, graph_set: str, window: int, repeats: int) -> dict:
    """Run in a fresh process: ms and peak MB of one window of `window` tokens (see module doc)."""
    set_name, variant = GRAPH_SETS[graph_set]
    runtime = load_offline(bundle, variant=variant, threads=1, graph_set=set_name)
    encoder = runtime.graphs["encoder"]
    encoder.run(np.ones((1, 1), np.int64), np.ones((1, 1), bool))
    before = peak_mb()
    ids = np.random.default_rng(0).integers(2, len(runtime.vocab), size=(1, window))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        encoder.run(ids, ids != 0)
        times.append(time.perf_counter() - t)
    ms = 1000 * float(np.median(times))
    n_win = len(split_windows(list(range(DOC_TOKENS)), window))
    return {"graph_set": graph_set, "file": encoder.file, "window": window,
            "ms_per_window": round(ms, 2), "ms_per_token": round(ms / window, 3),
            "windows_per_doc": n_win, "ms_per_5000_token_doc": round(ms * n_win, 1),
            "peak_mb_added": round(peak_mb() - before, 1), "loaded_mb": round(before, 1)}


def cost(bundle: str, repeats: int) -> list[dict]:
    rows = []
    for graph_set in GRAPH_SETS:
        for window in WINDOWS:
            out = subprocess.run([sys.executable, "-m", "bench.windows", "--cost-one", graph_set, str(window),
                                  "--bundle", bundle, "--repeats", str(repeats)],
                                 check=True, capture_output=True, text=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def embed(runtime: Runtime, rows: list[list[int]], window: int | None, overlap: int = 0,
          truncate: bool = False) -> np.ndarray:
    """L2-normalised vectors of id rows: whole (window None), truncated or windowed + pooled."""
    pieces: list[list[list[int]]] = []
    for ids in rows:
        if window is None:
            pieces.append([ids])
        elif truncate:
            pieces.append([ids[:window]])
        else:
            pieces.append(split_windows(ids, window, overlap))
    flat = [w for p in pieces for w in p]
    order = sorted(range(len(flat)), key=lambda i: len(flat[i]))
    vectors = np.zeros((len(flat), runtime.dim), np.float32)
    for start in range(0, len(order), 8):  # equal-ish lengths per call: little padding
        part = order[start:start + 8]
        vectors[part] = runtime.embed([flat[i] for i in part])
    out, at = [], 0
    for p in pieces:
        out.append(pool_windows(vectors[at:at + len(p)], [len(w) for w in p]))
        at += len(p)
    result = np.stack(out)
    return result / np.linalg.norm(result, axis=1, keepdims=True)


def load_documents(data: Path, seed: int) -> list[list[tuple[str, str]]]:
    """Documents as lists of (premise, entailed hypothesis), 200-1,500 tokens each."""
    rng = np.random.default_rng(seed)
    docs = []
    for rel in SOURCES:
        premises: dict[str, str] = {}
        for row in read_jsonl(data / rel):
            if row["gold_label"] == "entailment":
                premises.setdefault(row["sentence1"], row["sentence2"])
        items = list(premises.items())
        at = 0
        while at < len(items):
            target, doc, n = int(rng.integers(200, 1501)), [], 0
            while at < len(items) and n < target:
                doc.append(items[at])
                n += len(tokenize(items[at][0]))
                at += 1
            if n >= 200:
                docs.append(doc)
    return docs


def agreement(runtime: Runtime, docs: list[list[tuple[str, str]]]) -> list[dict]:
    ids = [runtime.vocab.ids(runtime.vocab.tokens(" ".join(p for p, _ in d))) for d in docs]
    rows = []
    for length in (200, 300, 500):
        texts = [i[:length] for i in ids if len(i) >= length][:60]
        whole = embed(runtime, texts, None)
        for window in WINDOWS:
            if window >= length:
                continue
            for name, kw in (("window", {}), ("window, 25% overlap", {"overlap": window // 4}),
                             ("truncate", {"truncate": True})):
                cos = np.sum(whole * embed(runtime, texts, window, **kw), axis=1)
                rows.append({"tokens": length, "texts": len(texts), "window": window, "policy": name,
                             "mean_cosine": round(float(cos.mean()), 4),
                             "min_cosine": round(float(cos.min()), 4)})
    return rows


def retrieval(runtime: Runtime, docs: list[list[tuple[str, str]]], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    doc_ids = [runtime.vocab.ids(runtime.vocab.tokens(" ".join(p for p, _ in d))) for d in docs]
    queries: dict[str, list[list[int]]] = {"verbatim": [], "paraphrase": []}
    late = []
    for doc in docs:
        start = int(rng.integers(0, max(1, len(doc) - 3)))
        part = doc[start:start + 4]
        queries["verbatim"].append(runtime.vocab.ids(runtime.vocab.tokens(" ".join(p for p, _ in part))))
        queries["paraphrase"].append(runtime.vocab.ids(runtime.vocab.tokens(" ".join(h for _, h in part))))
        late.append(sum(len(tokenize(p)) for p, _ in doc[:start]) >= 128)
    late_mask = np.array(late)
    query_vecs = {k: embed(runtime, v, 128) for k, v in queries.items()}
    rows = []
    for window in WINDOWS:
        for policy in ("window", "truncate"):
            doc_vecs = embed(runtime, doc_ids, window, truncate=policy == "truncate")
            for kind, q in query_vecs.items():
                scores = q @ doc_vecs.T
                rank = (scores > scores[np.arange(len(docs)), np.arange(len(docs))][:, None]).sum(axis=1)
                rows.append({"window": window, "policy": policy, "query": kind, "documents": len(docs),
                             "top1": round(float((rank == 0).mean()), 3),
                             "mrr": round(float((1 / (rank + 1)).mean()), 3),
                             "top1_past_128": round(float((rank[late_mask] == 0).mean()), 3),
                             "queries_past_128": int(late_mask.sum())})
    return rows


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (for Spearman's correlation)."""
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(len(x))
    _, inverse = np.unique(x, return_inverse=True)
    return (np.bincount(inverse, weights=r) / np.bincount(inverse))[inverse]


def sts(runtime: Runtime, data: Path, longer_than: int = 24) -> list[dict]:
    pairs = []
    for rel in ("stsb/train.jsonl.gz", "stsb/dev.jsonl.gz"):
        pairs += read_jsonl(data / rel)
    a = [runtime.vocab.ids(runtime.vocab.tokens(p["sentence1"])) for p in pairs]
    b = [runtime.vocab.ids(runtime.vocab.tokens(p["sentence2"])) for p in pairs]
    keep = [i for i in range(len(pairs)) if max(len(a[i]), len(b[i])) > longer_than]
    a, b = [a[i] for i in keep], [b[i] for i in keep]
    gold = ranks(np.array([float(pairs[i]["score"]) for i in keep]))
    rows = []
    for window, policy in ((None, "whole"), (16, "window"), (16, "truncate"), (8, "window"), (8, "truncate")):
        cos = np.sum(embed(runtime, a, window, truncate=policy == "truncate") *
                     embed(runtime, b, window, truncate=policy == "truncate"), axis=1)
        rows.append({"pairs": len(keep), "window": window, "policy": policy,
                     "spearman": round(float(np.corrcoef(ranks(cos), gold)[0, 1]), 4)})
    return rows


def run(args: argparse.Namespace) -> dict:
    runtime = load_offline(args.bundle, threads=args.threads)
    docs = load_documents(args.data, args.seed)
    lengths = [sum(len(tokenize(p)) for p, _ in d) for d in docs]
    return {"machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
                       f"{len(__import__('os').sched_getaffinity(0))} cores)",
            "bundle": runtime.name, "graph_set": f"{runtime.graph_set}/{runtime.variant}",
            "documents": {"count": len(docs), "mean_tokens": round(float(np.mean(lengths)), 1),
                          "max_tokens": int(max(lengths))},
            "cost": cost(str(args.bundle), args.repeats),
            "agreement": agreement(runtime, docs),
            "retrieval": retrieval(runtime, docs, args.seed),
            "sts": sts(runtime, args.data)}


def markdown(r: dict) -> str:
    lines = [f"machine: {r['machine']}; bundle {r['bundle']}",
             "", "| graphs | W | ms / window | ms / token | ms / 5,000-token doc | peak MB added |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['graph_set']} ({c['file']}) | {c['window']} | {c['ms_per_window']} | "
              f"{c['ms_per_token']} | {c['ms_per_5000_token_doc']} | {c['peak_mb_added']} |"
              for c in r["cost"]]
    lines += ["", "| text tokens | W | policy | mean cosine to whole | min |", "|---:|---:|---|---:|---:|"]
    lines += [f"| {a['tokens']} | {a['window']} | {a['policy']} | {a['mean_cosine']} | {a['min_cosine']} |"
              for a in r["agreement"]]
    d = r["documents"]
    lines += ["", f"retrieval: {d['count']} documents, mean {d['mean_tokens']} tokens "
              f"(max {d['max_tokens']})",
              "", "| W | policy | query | top-1 | MRR | top-1, paragraph past token 128 (n) |",
              "|---:|---|---|---:|---:|---:|"]
    lines += [f"| {x['window']} | {x['policy']} | {x['query']} | {x['top1']} | {x['mrr']} | "
              f"{x['top1_past_128']} ({x['queries_past_128']}) |" for x in r["retrieval"]]
    lines += ["", "| STS-B pairs (longer sentence > 24 tokens) | W | policy | Spearman |",
              "|---:|---:|---|---:|"]
    lines += [f"| {x['pairs']} | {x['window'] or '-'} | {x['policy']} | {x['spearman']} |" for x in r["sts"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("bench/results/windows.json"))
    parser.add_argument("--cost-one", nargs=2, metavar=("SET", "W"), help=argparse.SUPPRESS)
    parser.add_argument("--sts-only", action="store_true", help="only part 4 (prints its table)")
    args, _ = parser.parse_known_args(argv)
    if args.cost_one:
        print(json.dumps(cost_one(args.bundle, args.cost_one[0], int(args.cost_one[1]), args.repeats)))
        return 0
    if args.sts_only:
        print(json.dumps(sts(load_offline(args.bundle, threads=args.threads), args.data), indent=1))
        return 0
    return run_and_report(parser, run, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
