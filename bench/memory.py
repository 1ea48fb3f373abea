"""Resident memory of a loaded bundle: each bundle in a fresh process, every route called once.

    python -m bench.memory --bundles OLD NEW [--json OUT]

For each bundle a new Python process loads `disan.Encoder(bundle)` on the CPU (every graph of the
default set), runs `/embed`'s, `/nli`'s and `/sentiment`'s graphs once on a few texts, and reports
its resident set (VmRSS, and the peak VmHWM, from /proc/self/status: Linux only) before loading
and after the calls. A fresh process per bundle, so one bundle's pages do not count for another.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.report import run_and_report

# Run in the child: the numbers are that process's own.
CHILD = r"""
import json, sys

def status(key):
    line = next(x for x in open("/proc/self/status") if x.startswith(key + ":"))
    return int(line.split()[1]) // 1024  # kB -> MiB

before = status("VmRSS")
from disan import Encoder

enc = Encoder(sys.argv[1], providers="cpu")
texts = ["a cozy , applaud-worthy film", "a man is playing the guitar"] * 32
enc.encode(texts)
enc.sentiment(texts)
enc.nli([(texts[0], texts[1])] * 8)
print(json.dumps({"rss_before_mib": before, "rss_after_mib": status("VmRSS"), "peak_mib": status("VmHWM"),
                  "graphs": sorted(enc.runtime.graphs)}))
"""


def run(args: argparse.Namespace) -> dict:
    rows = []
    for bundle in args.bundles:
        out = subprocess.run([sys.executable, "-c", CHILD, str(bundle)], capture_output=True, text=True,
                             check=True)
        rows.append({"bundle": str(bundle), **json.loads(out.stdout.strip().splitlines()[-1])})
        print(rows[-1], flush=True)
    return {"rows": rows}


def markdown(results: dict) -> str:
    lines = ["| bundle | RSS before load (MiB) | RSS after the calls (MiB) | peak (MiB) |",
             "|---|---|---|---|"]
    lines += [f"| {r['bundle']} | {r['rss_before_mib']} | {r['rss_after_mib']} | {r['peak_mib']} |"
              for r in results["rows"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=Path, nargs="+", required=True)
    parser.add_argument("--json", type=Path, default=Path("bench/results/memory.json"))
    return run_and_report(parser, run, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
