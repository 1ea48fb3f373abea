"""`disan experiment` grid specs for research's experiment tests: a tiny sentiment grid over the
files a test writes, and two rows to run."""

from __future__ import annotations

from pathlib import Path


def write_grid_spec(path: Path, data: Path, rows: str, seeds=(1, 2)) -> Path:
    path.write_text(f"""
name = "tiny"
seeds = {list(seeds)}
[train]
task = "sentiment"
train = ["{data}/train.jsonl"]
dev = "{data}/dev.jsonl"
test = "{data}/test.jsonl"
glove = "{data}/glove.txt"
glove_extra = 3
d_h = 8
batch_size = 16
epochs = 2
eval_every = 2
threads = 1
{rows}""")
    return path


GRID_ROWS = """
[[rows]]
name = "disan"
paper = 51.72
[[rows]]
name = "diag"
train = { mask_kind = "diag" }
"""
