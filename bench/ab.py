"""Alternating A/B of two checkouts' default servers: sentences/s, p50 and server CPU per request.

    python -m bench.ab --before /tmp/before [--after .] [--rounds 5] [--seconds 5] [--json OUT]

Each round starts `disan serve` (default settings, one process) from each checkout in turn, on
that checkout's own `models/default` unless --bundle is given, and drives POST /embed with one
SNLI-length sentence per request at each --concurrency (wrk, else bench.load); `--stub` replaces
the encoder by zeros (bench.overhead's stub) to compare the path without inference. Alternating
rounds expose both checkouts to the same background load; on a shared machine read the server
CPU per request (from /proc, the least disturbed measure) and the best / median ratios, not
single runs. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.offline import load_sentences
from bench.report import run_and_report
from bench.server import Server, load, process_tree_cpu


def one_server(tree: Path, bundle: Path | None, body: Path, concurrency: list[int],
               seconds: float, stub: bool = False, **settings: object) -> dict:
    """{concurrency: sentences/s, p50 ms, server CPU µs per request} for one checkout's server
    (`stub`: its encoder replaced by zeros, bench.overhead's stub: the path without inference;
    `settings`: DISAN_* settings of the server)."""
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)  # the server process imports that checkout's code
    try:
        stub_cmd = [sys.executable, "-c", "from bench.overhead import serve_stub; serve_stub()"]
        command = stub_cmd if stub else None
        with Server(bundle or tree / "models" / "default", command=command, cwd=tree, **settings) as server:
            out = {}
            for c in concurrency:
                load(server.url, body, c, 1.0, 1)  # warm-up
                cpu = process_tree_cpu(server.proc.pid)
                stats = load(server.url, body, c, seconds, 1)
                used = process_tree_cpu(server.proc.pid) - cpu
                ok = max(1, stats["requests"] - stats["non2xx"])
                out[str(c)] = {"sentences_per_s": round(stats["sentences_per_s"], 1),
                               "p50_ms": round(stats["p50_ms"], 2),
                               "cpu_us_per_request": round(1e6 * used / ok)}
            return out
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before


def run_ab(args: argparse.Namespace) -> dict:
    sentences = load_sentences(args.data, args.sentences)["11-25"]
    if args.before is None:
        raise SystemExit("bench.ab: give --before (the checkout to compare with)")
    body = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    body.write_text("".join(json.dumps({"texts": [s]}) + "\n" for s in sentences))
    sides = {"before": (args.before.resolve(), {}), "after": (args.after.resolve(), {})}
    rounds: dict[str, list[dict]] = {k: [] for k in sides}
    load_average = [os.getloadavg()]
    try:
        for i in range(args.rounds):
            for label, (tree, settings) in sides.items():
                got = one_server(tree, args.bundle, body, args.concurrency, args.seconds, args.stub,
                                 **settings)
                rounds[label].append(got)
                print(i, label, settings, got, flush=True)
            load_average.append(os.getloadavg())
    finally:
        body.unlink()
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores", "stub": args.stub,
            "sides": {label: settings for label, (_, settings) in sides.items()},
            "load_average": load_average, "seconds": args.seconds, "rounds": rounds}


def markdown(results: dict) -> str:
    """Best and median per side, and after / before for each, per concurrency and metric."""
    rounds = results["rounds"]
    before, after = "before", "after"
    lines = [f"| concurrency | metric | {before} best / median "
             f"| {after} best / median | {after} / {before} (best, median) |", "|---|---|---|---|---|"]
    for c in rounds["before"][0]:
        for key, better in (("sentences_per_s", max), ("p50_ms", min), ("cpu_us_per_request", min)):
            b = [r[c][key] for r in rounds["before"]]
            a = [r[c][key] for r in rounds["after"]]
            bb, ab_ = better(b), better(a)
            bm, am = float(np.median(b)), float(np.median(a))
            lines.append(f"| {c} | {key} | {bb:g} / {bm:g} | {ab_:g} / {am:g} "
                         f"| {ab_ / bb:.2f}, {am / bm:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="checkout of the old code")
    parser.add_argument("--after", type=Path, default=Path("."), help="checkout of the new code")
    parser.add_argument("--bundle", type=Path, help="one bundle for both (default: each checkout's own)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--stub", action="store_true", help="encoder replaced by zeros (bench.overhead)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/ab.json"))
    return run_and_report(parser, run_ab, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
