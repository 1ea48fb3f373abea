"""The shared tail of every bench script: parse flags, run, write the JSON, print the table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def run_and_report(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], dict],
                   markdown: Callable[[dict], str], argv: list[str] | None = None) -> int:
    """Parse `argv`, run the benchmark, write its results to `--json`, print the markdown table."""
    args = parser.parse_args(argv)
    results = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(markdown(results))
    return 0
