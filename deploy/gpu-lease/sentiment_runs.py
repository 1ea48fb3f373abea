"""Join the metrics of a lease's SST-5 runs into one file and name the run to bring back.

    python3 sentiment_runs.py OUT.jsonl RUN_DIR/metrics.jsonl...

Each line of OUT.jsonl is one line of a run's metrics.jsonl with its `seed` (from the folder name,
`sst5-sSEED`), because a reply brings back at most 8 files. Prints the folder of the run whose
final dev accuracy is highest (the first on a tie): dev selects, test is only reported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def join(out: Path, paths: list[Path]) -> Path:
    best: tuple[float, Path] | None = None
    with out.open("w") as fh:
        for path in paths:
            seed = int(path.parent.name.rsplit("-s", 1)[1])
            for line in path.read_text().splitlines():
                row = {"seed": seed, **json.loads(line)}
                fh.write(json.dumps(row) + "\n")
                if row.get("event") == "final" and (best is None or row["dev_acc"] > best[0]):
                    best = (row["dev_acc"], path.parent)
    if best is None:
        raise SystemExit("no run finished (no final line in any metrics.jsonl)")
    return best[1]


if __name__ == "__main__":
    print(join(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
