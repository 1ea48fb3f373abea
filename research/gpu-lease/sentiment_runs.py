"""Join the metrics of a lease's SST-5 runs into one file and rank the runs to bring back.

    python3 sentiment_runs.py OUT.jsonl RUN_DIR/metrics.jsonl...

Each line of OUT.jsonl is one line of a run's metrics.jsonl with its `seed` (from the folder name,
`sst5-sSEED`), because a reply brings back at most 8 files. Prints the folders of the finished
runs, one a line, by final dev accuracy, best first (in the given order on a tie): dev selects,
test is only reported. Several come back because the choice is made on dev as served, which can
rank runs otherwise than dev as trained (docs/experiments.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def join(out: Path, paths: list[Path]) -> list[Path]:
    finished: list[tuple[float, Path]] = []
    with out.open("w") as fh:
        for path in paths:
            seed = int(path.parent.name.rsplit("-s", 1)[1])
            for line in path.read_text().splitlines():
                row = {"seed": seed, **json.loads(line)}
                fh.write(json.dumps(row) + "\n")
                if row.get("event") == "final":
                    finished.append((row["dev_acc"], path.parent))
    if not finished:
        raise SystemExit("no run finished (no final line in any metrics.jsonl)")
    return [run for _, run in sorted(finished, key=lambda f: -f[0])]  # stable: first on a tie


if __name__ == "__main__":
    print("\n".join(map(str, join(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))))
