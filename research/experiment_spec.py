"""The grid spec of `disan experiment` (TOML): parsing and checks, and each row's `disan train` flags.

A spec names the experiment, its seeds, the `disan train` options shared by every row (`[train]`,
TrainConfig field names) and the rows, each a name plus its own overrides (the format is in
`research/experiment.py`'s docstring).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from disan.train.config import TrainConfig

# Set by the runner itself, never by a spec.
RUNNER_OWNED = {"out", "seed", "progress"}
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class Row:
    name: str
    train: dict
    paper: float | None = None
    label: str = ""
    stage: int = 1


@dataclass
class Spec:
    name: str
    seeds: list[int]
    rows: list[Row]
    path: Path
    note: str = ""
    train: dict = field(default_factory=dict)

    @property
    def results_path(self) -> Path:
        return self.path.parent / "results" / f"{self.name}.jsonl"


def train_fields() -> set[str]:
    """TrainConfig's field names: what a spec may set."""
    return set(TrainConfig.__dataclass_fields__)


def load_spec(path: str | Path, fields: set[str] | None = None) -> Spec:
    """Parse and check a grid spec; every problem is a one-line ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such grid spec")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML ({exc})") from None
    unknown = set(raw) - {"name", "seeds", "train", "rows", "note"}
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {sorted(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"{path}: 'name' must be a plain name (letters, digits, _ . -)")
    seeds = raw.get("seeds")
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)
            and len(set(seeds)) == len(seeds)):
        raise ValueError(f"{path}: 'seeds' must be a non-empty list of distinct integers")
    base = raw.get("train", {})
    rows = []
    for i, r in enumerate(raw.get("rows", [])):
        rname = r.get("name")
        if not isinstance(rname, str) or not NAME_RE.match(rname):
            raise ValueError(f"{path}: rows[{i}] needs a plain 'name' (letters, digits, _ . -)")
        extra = set(r) - {"name", "train", "paper", "label", "stage"}
        if extra:
            raise ValueError(f"{path}: row {rname!r}: unknown keys {sorted(extra)}")
        if not isinstance(r.get("stage", 1), int):
            raise ValueError(f"{path}: row {rname!r}: 'stage' must be an integer")
        rows.append(Row(rname, dict(r.get("train", {})), r.get("paper"), r.get("label", rname),
                        r.get("stage", 1)))
    if not rows:
        raise ValueError(f"{path}: no [[rows]]")
    if len({r.name for r in rows}) != len(rows):
        raise ValueError(f"{path}: row names must be unique")
    for where, opts in [("[train]", base)] + [(f"row {r.name!r}", r.train) for r in rows]:
        owned = RUNNER_OWNED & set(opts)
        if owned:
            raise ValueError(f"{path}: {where}: {sorted(owned)} are set by the runner, not the spec")
        if fields is not None and set(opts) - fields:
            raise ValueError(f"{path}: {where}: not TrainConfig fields: {sorted(set(opts) - fields)}")
    return Spec(name, seeds, rows, path, raw.get("note", ""), dict(base))


def row_options(spec: Spec, row: Row) -> dict:
    """The row's `disan train` options: the spec's [train] updated by the row's own."""
    return {**spec.train, **row.train}


def row_key(spec: Spec, row: Row) -> str:
    """Short hash of what a row trains with: results and run dirs of another config never mix."""
    blob = json.dumps(row_options(spec, row), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def to_argv(options: dict) -> list[str]:
    """TrainConfig-named options -> `disan train` flags (field x_y is flag --x-y)."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def train_command(spec: Spec, row: Row) -> str:
    """The bash loop of `disan train` commands of one row (what the table prints beside it)."""
    argv = shlex.join(["disan", "train", *to_argv(row_options(spec, row))])
    out = f"runs/{spec.name}/{row.name}/seed$s"
    return f"for s in {' '.join(map(str, spec.seeds))}; do {argv} --seed $s --out {out}; done"
