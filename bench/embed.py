"""`disan embed` on a large corpus: rate against bench/offline.py's encoder, RSS, kill -9 + resume, Ray.

    python -m bench.embed --sentences 1000000 [--data ../shared/data] [--work /tmp/disan-embed-bench] \\
        [--ray-sentences 100000] [--json bench/results/embed.json]

The corpus: every distinct sentence of the staged sentence-level files (SNLI dev/test, MultiNLI
dev, SST-5 train/dev/test, STS-B train/dev; no phrase fragments), repeated and shuffled up to
--sentences, written under --work (outside the repository) as JSONL and Parquet.

1. Reference: bench/offline.py's `throughput` of its ORT encoder (`ort_encoder`: the service's
   tokenizer and cells-cut batches) on a random --reference-sample of the same corpus, best of 3,
   before and after the long run (their mean is the reference: the 2 cores are shared).
2. One `disan embed` run of the whole JSONL corpus, killed with SIGKILL once --kill-at of the rows
   are committed, then the same command again: sentences/s over both runs' wall time (start-up,
   the count of rows for the ETA and the redone shard included), the peak RSS of either process
   (VmHWM, and VmRSS sampled every 0.5 s), and a check that every row id is present exactly once.
3. Ray: the first --ray-sentences rows as Parquet, `disan embed` single-process and `--ray local`
   (same CPUs), wall time of each; the overhead is Ray's extra time.

On a shared machine the reference moves with the load, so `--paired N` runs instead N rounds of
(the offline encoder, then `disan embed`) on the same --reference-sample rows (one pass each, the
CLI's own "sentences/s this run": reading, tokenizing, embedding and writing, without interpreter
start-up and bundle load) and reports each round's ratio: neighbours in time share the load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.offline import CPU_BATCHING, ort_encoder, throughput
from bench.report import run_and_report
from disan.data.readers import read_jsonl
from disan.runtime.ort_session import cpu_cores
from disan.runtime.runtime import load_offline

PAIRS, TEXT = ("sentence1", "sentence2"), ("text",)
SOURCES = {"snli/dev.jsonl.gz": PAIRS, "snli/test_tok.jsonl.gz": PAIRS, "mnli/dev_matched.jsonl.gz": PAIRS,
           "sst/sst5_train.jsonl.gz": TEXT, "sst/sst5_dev.jsonl.gz": TEXT, "sst/sst5_test.jsonl.gz": TEXT,
           "stsb/train.jsonl.gz": PAIRS, "stsb/dev.jsonl.gz": PAIRS}
REPO = Path(__file__).resolve().parents[1]


def distinct_sentences(data: Path) -> list[str]:
    seen: dict[str, None] = {}
    for rel, keys in SOURCES.items():
        for row in read_jsonl(data / rel):
            for key in keys:
                if isinstance(row.get(key), str) and row[key].strip():
                    seen.setdefault(row[key].strip())
    return list(seen)


def build_corpus(args: argparse.Namespace) -> tuple[list[str], int]:
    """The corpus texts (repeated + shuffled to --sentences) and how many are distinct."""
    pool = distinct_sentences(args.data)
    rng = np.random.default_rng(0)
    reps = -(-args.sentences // len(pool))
    order = np.concatenate([rng.permutation(len(pool)) for _ in range(reps)])[: args.sentences]
    return [pool[i] for i in order], len(pool)


def write_inputs(texts: list[str], work: Path, ray_rows: int) -> tuple[Path, Path]:
    import pyarrow as pa  # the embed extra, like the command measured
    import pyarrow.parquet as pq

    work.mkdir(parents=True, exist_ok=True)
    jsonl = work / "corpus.jsonl"
    with open(jsonl, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": f"s{i}", "text": text}) + "\n")
    parquet = work / "corpus_ray.parquet"
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(ray_rows)], "text": texts[:ray_rows]}), parquet,
                   row_group_size=10_000)
    return jsonl, parquet


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a live process in MB (0, 0 once it is gone)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return 0.0, 0.0
    return tuple(int(fields.get(k, "0 kB").split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def embed_cmd(src: Path, out: Path, args: argparse.Namespace, *extra: str) -> list[str]:
    return [sys.executable, "-m", "disan.cli", "embed", str(src), "-o", str(out), "--id-column", "id",
            "--bundle", str(args.bundle), "--threads", str(args.threads), "--providers", "cpu",
            "--shard-size", str(args.shard_size), "--no-progress", *extra]


def watch(cmd: list[str], kill_rows: int | None = None, progress: Path | None = None) -> dict:
    """Run `cmd`, sampling its RSS; SIGKILL it once `progress` says `kill_rows` rows are committed."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_rss = peak_hwm = 0.0
    killed = False
    while proc.poll() is None:
        rss, hwm = rss_mb(proc.pid)
        peak_rss, peak_hwm = max(peak_rss, rss), max(peak_hwm, hwm)
        if kill_rows is not None and progress is not None and progress.exists():
            try:
                rows = json.loads(progress.read_text())["rows"]
            except (ValueError, KeyError):
                rows = 0  # read while being replaced: the next sample sees it
            if rows >= kill_rows:
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
        time.sleep(0.5)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0 and not killed:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return {"seconds": round(time.perf_counter() - started, 1), "peak_rss_mb": round(peak_rss, 1),
            "peak_hwm_mb": round(peak_hwm, 1), "killed": killed, "returncode": proc.returncode,
            "last_line": err.strip().splitlines()[-1] if err.strip() else ""}


def check_ids(out: Path, n: int) -> dict:
    """Every id s0..s{n-1} exactly once (read from the shards' id column only)."""
    import pyarrow.parquet as pq  # the embed extra

    counts = np.zeros(n, dtype=np.int32)
    for part in sorted(out.glob("*.parquet")):
        ids = pq.read_table(part, columns=["id"]).column("id").to_pylist()
        np.add.at(counts, [int(i[1:]) for i in ids], 1)
    return {"rows": int(counts.sum()), "missing": int((counts == 0).sum()),
            "duplicated": int((counts > 1).sum())}


def machine_line() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores ({cpu_cores()} usable), "
            f"Python {platform.python_version()}")


def reference(args: argparse.Namespace, sample: list[str]) -> float:
    """bench/offline.py's ORT fp32 rate on `sample`: best of 3 passes."""
    rt = load_offline(args.bundle, "fp32", threads=args.threads)
    return throughput(ort_encoder(rt), sample, CPU_BATCHING.max_batch_size, 3, CPU_BATCHING.max_batch_cells)


def run_paired(args: argparse.Namespace, texts: list[str], machine: dict) -> dict:
    """--paired N: rounds of (offline encoder, `disan embed`) on one sample (see the docstring)."""
    rng = np.random.default_rng(1)
    sample = [texts[i] for i in rng.choice(len(texts), size=args.reference_sample, replace=False)]
    src = args.work / "sample.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(sample)))
    rt = load_offline(args.bundle, "fp32", threads=args.threads)
    rounds = []
    for _ in range(args.paired):
        ref = throughput(ort_encoder(rt), sample, CPU_BATCHING.max_batch_size, 1,
                         CPU_BATCHING.max_batch_cells)
        run = watch(embed_cmd(src, args.work / "paired", args, "--overwrite"))
        cli = float(run["last_line"].rsplit(";", 1)[1].split()[0])
        rounds.append({"offline": round(ref), "disan_embed": round(cli), "ratio": round(cli / ref, 3),
                       "load_average_1min": round(os.getloadavg()[0], 1), "peak_rss_mb": run["peak_hwm_mb"]})
        print(rounds[-1], flush=True)
    ratios = [r["ratio"] for r in rounds]
    return {**machine, "paired": rounds, "sentences": len(sample), "median_ratio": float(np.median(ratios))}


def run_bench(args: argparse.Namespace) -> dict:
    texts, distinct = build_corpus(args)
    if args.paired:
        args.work.mkdir(parents=True, exist_ok=True)
        return run_paired(args, texts, {"machine": machine_line(), "date": time.strftime("%Y-%m-%d"),
                                        "threads": args.threads})
    jsonl, parquet = write_inputs(texts, args.work, args.ray_sentences)
    results: dict = {
        "machine": machine_line(),
        "date": time.strftime("%Y-%m-%d"), "sentences": len(texts), "distinct": distinct,
        "threads": args.threads, "shard_size": args.shard_size, "bundle": str(args.bundle),
    }
    # 1. the offline encoder's rate on a sample of the same corpus, before and after the long run
    # (the machine is shared: the load average is reported beside it)
    rng = np.random.default_rng(1)
    sample = [texts[i] for i in rng.choice(len(texts), size=args.reference_sample, replace=False)]
    before = reference(args, sample)
    print(f"offline encoder: {before:.0f} sentences/s", flush=True)
    load = [os.getloadavg()[0]]
    # 2. the whole corpus, killed once, resumed
    out = args.work / "out"
    cmd = embed_cmd(jsonl, out, args, "--overwrite")
    first = watch(cmd, kill_rows=int(args.kill_at * len(texts)), progress=out / "_progress.json")
    at_kill = json.loads((out / "_progress.json").read_text())
    print(f"killed: {first}, {at_kill['rows']} rows committed", flush=True)
    load.append(os.getloadavg()[0])
    second = watch(embed_cmd(jsonl, out, args))
    load.append(os.getloadavg()[0])
    after = reference(args, sample)
    ref = (before + after) / 2
    results.update(offline_sentences_per_s=round(ref, 1), offline_before_after=[round(before), round(after)],
                   load_average_1min=[round(x, 1) for x in load])
    print(f"offline encoder after: {after:.0f} sentences/s", flush=True)
    total = first["seconds"] + second["seconds"]
    results["single"] = {"first_run": first, "rows_committed_at_kill": at_kill["rows"],
                         "resumed_run": second, "seconds": round(total, 1),
                         "sentences_per_s": round(len(texts) / total, 1),
                         "of_offline": round(len(texts) / total / ref, 3),
                         "peak_rss_mb": max(first["peak_hwm_mb"], second["peak_hwm_mb"]),
                         "ids": check_ids(out, len(texts))}
    print(f"single: {results['single']}", flush=True)
    # 3. Ray local against the single process, same rows, same CPUs
    if args.ray_sentences:
        one = watch(embed_cmd(parquet, args.work / "one", args, "--overwrite"))
        ray = watch(embed_cmd(parquet, args.work / "ray", args, "--overwrite", "--ray", "local",
                              "--ray-cpus", str(cpu_cores())))
        results["ray"] = {"sentences": args.ray_sentences, "single_seconds": one["seconds"],
                          "ray_seconds": ray["seconds"],
                          "overhead": round(ray["seconds"] / one["seconds"] - 1, 3),
                          "ids": check_ids(args.work / "ray", args.ray_sentences)}
        print(f"ray: {results['ray']}", flush=True)
    return results


def markdown(r: dict) -> str:
    if "paired" in r:
        rows = [f"| {i + 1} | {p['offline']} | {p['disan_embed']} | {p['ratio']:.0%} | "
                f"{p['load_average_1min']} |" for i, p in enumerate(r["paired"])]
        return "\n".join([f"Machine: {r['machine']}; {r['date']}; {r['sentences']:,} sentences; median ratio "
                          f"{r['median_ratio']:.0%}.", "", "| round | offline sent/s | disan embed sent/s | "
                          "ratio | load (1 min) |", "|---|---|---|---|---|", *rows])
    s = r["single"]
    lines = [f"Machine: {r['machine']}; {r['date']}; {r['sentences']:,} sentences ({r['distinct']:,} "
             f"distinct, repeated and shuffled); ORT fp32, {r['threads']} threads; shards of "
             f"{r['shard_size']:,}.", "", "| measure | value |", "|---|---|",
             f"| offline encoder (bench/offline.py's throughput on a sample; before / after) | "
             f"{r['offline_sentences_per_s']:.0f} sent/s "
             f"({' / '.join(map(str, r['offline_before_after']))}) |",
             f"| load average (1 min) at start / kill / end: the machine is shared | "
             f"{' / '.join(map(str, r['load_average_1min']))} |",
             f"| `disan embed`, killed at {s['rows_committed_at_kill']:,} rows + resumed | "
             f"{s['sentences_per_s']:.0f} sent/s ({s['of_offline']:.0%} of offline), {s['seconds']:.0f} s |",
             f"| peak RSS (VmHWM, either run) | {s['peak_rss_mb']:.0f} MB |",
             f"| ids after the resume | {s['ids']['rows']:,} rows, {s['ids']['missing']} missing, "
             f"{s['ids']['duplicated']} duplicated |"]
    if "ray" in r:
        y = r["ray"]
        lines.append(f"| {y['sentences']:,} rows: single process / `--ray local` | "
                     f"{y['single_seconds']:.0f} s / {y['ray_seconds']:.0f} s (Ray overhead "
                     f"{y['overhead']:+.0%}); ids: {y['ids']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/disan-embed-bench"))
    parser.add_argument("--sentences", type=int, default=1_000_000)
    parser.add_argument("--reference-sample", type=int, default=20_000)
    parser.add_argument("--ray-sentences", type=int, default=100_000, help="0: no Ray comparison")
    parser.add_argument("--kill-at", type=float, default=0.4, help="fraction of rows committed at the kill")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=10_000)
    parser.add_argument("--paired", type=int, default=0,
                        help="only N paired rounds (offline encoder, disan embed) on --reference-sample rows")
    parser.add_argument("--json", type=Path, default=Path("bench/results/embed.json"))
    return run_and_report(parser, run_bench, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
