"""`disan experiment`: run a grid of `disan train` configurations x seeds, resumably; tabulate it.

    disan experiment experiments/sst5_ablation.toml            # run (or resume) every unfinished run
    disan experiment experiments/sst5_ablation.toml --table    # mean ± std per row -> stdout + .md

The grid spec (TOML) names the experiment, its seeds, the `disan train` options shared by every
row (`[train]`, TrainConfig field names) and the rows, each a name plus its own overrides:

    name = "sst5_ablation"
    seeds = [0, 1, 2]
    [train]
    recipe = "sst5"
    max_minutes = 6
    [[rows]]
    name = "disan_no_direction"
    paper = 49.41                       # optional: the paper's test accuracy, shown in the table
    train = { mask_kind = "diag" }

Each run trains in-process through `disan train`'s own command line (so a row is exactly the
`disan train` command the table prints) into `<runs-dir>/<row>-<key>/seed<N>` (outside the repo);
`key` hashes the row's options, so editing a row starts fresh runs instead of resuming stale
ones. Rows may name a `stage` (default 1): all of stage 1 runs before stage 2, so the expensive
rows can wait until the cheap ones have all their seeds. A finished run appends one JSON line to
the results file (next to the spec, in `results/<name>.jsonl`); a run interrupted (Ctrl-C, a
killed session) resumes from its last.pt with what is left of its time budget. Runs go
seed-major (every row with the first seed, then the next seed; within each stage), so a partial
grid is already comparable across rows.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import disan.cli  # torch-free; each run is `disan train` in this process
from disan.train_config import TrainConfig

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


def read_results(path: Path) -> list[dict]:
    """Rows of a results file; a torn last line (killed mid-write) is skipped, not fatal."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            if line.strip():
                rows.append(json.loads(line))
    return rows


def read_metrics(run_dir: Path) -> tuple[list[dict], dict | None]:
    """(evaluation records, final event or None) from a run's metrics.jsonl."""
    history, final = [], None
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line)
                if rec.get("event") == "final":
                    final = rec
                elif "step" in rec:
                    history.append(rec)
    return history, final


def git_state(root: Path) -> dict:
    """Commit the runner's code came from, and whether disan/ had uncommitted changes."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    top = git("rev-parse", "--show-toplevel")
    dirty = bool(git("status", "--porcelain", "-uno", "--", f"{top}/disan")) if top else None
    return {"commit": git("rev-parse", "HEAD") or None, "dirty": dirty}


def _portable(value, data_root: Path, run_dir: Path):
    """Strip machine paths from a recorded config: <data>/... and <run>/... instead."""
    if isinstance(value, list):
        return [_portable(v, data_root, run_dir) for v in value]
    if isinstance(value, str):
        for prefix, name in ((str(run_dir), "<run>"), (str(data_root.resolve()), "<data>"),
                             (str(data_root), "<data>")):
            if value.startswith(prefix):
                return name + value[len(prefix):]
    return value


@dataclass
class Runner:
    spec: Spec
    runs_dir: Path
    data: Path
    run_progress: bool = False
    results_path: Path | None = None
    log: object = sys.stderr

    def __post_init__(self) -> None:
        self.results_path = self.results_path or self.spec.results_path
        # Read once: the code this process runs is the code it imported at start, whatever
        # the checkout's HEAD is by the time a run finishes.
        self.git = git_state(self.spec.path.parent)

    def run_dir(self, row: Row, seed: int) -> Path:
        return self.runs_dir / self.spec.name / f"{row.name}-{row_key(self.spec, row)}" / f"seed{seed}"

    def plan(self) -> tuple[list[tuple[Row, int]], int]:
        """(unfinished (row, seed) pairs, number already finished): stage by stage, seed-major."""
        done = {(r["row"], r["seed"], r.get("key")) for r in read_results(self.results_path)}
        stages = sorted({row.stage for row in self.spec.rows})
        todo = [(row, seed) for stage in stages for seed in self.spec.seeds for row in self.spec.rows
                if row.stage == stage and (row.name, seed, row_key(self.spec, row)) not in done]
        return todo, len(self.spec.seeds) * len(self.spec.rows) - len(todo)

    def argv(self, row: Row, seed: int) -> list[str]:
        """`disan train` arguments for a fresh run, or to resume one from its last.pt."""
        out = self.run_dir(row, seed)
        opts = row_options(self.spec, row)
        tail = [] if self.run_progress else ["--no-progress"]
        history, _ = read_metrics(out)
        if (out / "last.pt").is_file() and history:
            budget = float(opts.get("max_minutes", 0.0))
            resume = ["--resume", str(out / "last.pt"), "--out", str(out)]
            if budget > 0:  # what is left of it; a tiny floor (0 would mean "no budget")
                left = budget - history[-1]["elapsed_s"] / 60
                resume += ["--max-minutes", f"{max(left, 0.01):.4f}"]
            if opts.get("threads"):
                resume += ["--threads", str(opts["threads"])]
            return resume + tail
        data = ["--data", str(self.data)] if "recipe" in opts else []
        return to_argv(opts) + data + ["--seed", str(seed), "--out", str(out)] + tail

    def run_one(self, row: Row, seed: int) -> dict | None:
        """Train (or resume, or just collect) one run; -> its results row, None when it failed."""
        out = self.run_dir(row, seed)
        started = time.monotonic()
        _, final = read_metrics(out)
        if final is None:  # not finished: train or resume
            argv = self.argv(row, seed)
            print(f"[{self.spec.name}] {row.name} seed {seed}: disan train {shlex.join(argv)}",
                  file=self.log, flush=True)
            try:
                rc = disan.cli.main(["train", *argv])
            except SystemExit as exc:  # argparse rejected an option of the spec
                rc = exc.code if isinstance(exc.code, int) else 2
            if rc != 0:
                print(f"[{self.spec.name}] {row.name} seed {seed}: failed (exit {rc})", file=self.log)
                return None
        result = self.collect(row, seed, time.monotonic() - started)
        with self.results_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(result) + "\n")
        return result

    def collect(self, row: Row, seed: int, wall_s: float) -> dict:
        """The results row of a finished run, from its metrics.jsonl and best.pt.

        train_s: the trainer's clock (training + dev evaluations, summed over resumes); wall_s:
        this call's seconds for the run, with data loading and the test evaluation.
        """
        from disan.checkpoint import load_checkpoint  # torch: only once a run has finished

        out = self.run_dir(row, seed)
        history, final = read_metrics(out)
        best = load_checkpoint(out / "best.pt")
        train_cfg = {k: _portable(v, self.data, out) for k, v in best["train_config"].items()}
        # A resumed run's checkpoint holds the budget that was left; record the row's own.
        train_cfg["max_minutes"] = float(row_options(self.spec, row).get("max_minutes", 0.0))
        last = history[-1] if history else {}
        return {
            "experiment": self.spec.name, "row": row.name, "seed": seed, "key": row_key(self.spec, row),
            "dev_acc": final.get("dev_acc"), "test_acc": final.get("test_acc"),
            "dev_macro_f1": final.get("dev_macro_f1"), "test_macro_f1": final.get("test_macro_f1"),
            "best_step": final.get("best_step"), "steps": last.get("step"), "epochs": last.get("epoch"),
            "train_s": last.get("elapsed_s"), "wall_s": round(wall_s, 1),
            "stop_reason": final.get("stop_reason"), "sizes": final.get("sizes"),
            "options": row_options(self.spec, row), "train_config": train_cfg,
            "model_config": best["config"],
            "curve": [[r["step"], r["elapsed_s"], round(r["dev_acc"], 5)] for r in history],
            "git": self.git, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def run(self) -> int:
        """Every unfinished run, in order. Safe to interrupt: the next call resumes."""
        from tqdm.auto import tqdm  # the train extra; --table runs without it

        todo, done = self.plan()
        total = done + len(todo)
        self.results_path.parent.mkdir(parents=True, exist_ok=True)
        lock_dir = self.runs_dir / self.spec.name
        lock_dir.mkdir(parents=True, exist_ok=True)
        with _lock(lock_dir / ".lock"):
            print(f"[{self.spec.name}] {done}/{total} runs finished; {len(todo)} to run "
                  f"(results: {self.results_path}, runs: {lock_dir})", file=self.log, flush=True)
            failed = 0
            bar = tqdm(total=total, initial=done, unit="run", desc=self.spec.name, file=self.log,
                       dynamic_ncols=True)
            try:
                for row, seed in todo:
                    bar.set_postfix_str(f"{row.name} seed {seed}")
                    result = self.run_one(row, seed)
                    if result is None:
                        failed += 1
                    else:
                        write_table(self.spec, self.results_path)  # the table follows the grid
                        bar.write(f"[{self.spec.name}] {row.name} seed {seed}: dev {result['dev_acc']:.4f} "
                                  f"test {result['test_acc']:.4f} steps {result['steps']} "
                                  f"({result['stop_reason']})", file=self.log)
                    bar.update(1)
            except KeyboardInterrupt:
                bar.close()
                print(f"[{self.spec.name}] interrupted: run the same command again to resume",
                      file=self.log)
                return 130
            bar.close()
        return 1 if failed else 0


@contextlib.contextmanager
def _lock(path: Path):
    """One runner per grid: a second one (e.g. a later session's) refuses instead of racing."""
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{path}: another `disan experiment` is running this grid") from None
        fh.write(str(os.getpid()))
        fh.flush()
        yield


def mean_std(values: list[float]) -> str:
    """'m ± s' in percent (sample std), 'm' for one value."""
    pct = [100 * v for v in values]
    if len(pct) == 1:
        return f"{pct[0]:.2f}"
    return f"{statistics.mean(pct):.2f} ± {statistics.stdev(pct):.2f}"


def table(spec: Spec, results: list[dict]) -> str:
    """Markdown: mean ± std of test and dev accuracy per row over its finished seeds, each row with
    its own `disan train` flags (the shared ones are printed once above the table)."""
    lines = [f"# {spec.name}", ""]
    if spec.note:
        lines += [spec.note.strip(), ""]
    shared = shlex.join(["disan", "train", *to_argv(spec.train)])
    lines += ["Accuracy in %, mean ± sample std over the finished seeds (test at the dev-selected "
              f"checkpoint). Every cell: `{shared} ROW-FLAGS --seed S` for each seed S; the whole grid: "
              f"`disan experiment {spec.path.as_posix()}` (resumable); full commands below.", "",
              "| row | row flags | paper (test) | test acc | dev acc | seeds | steps (mean) "
              "| train min (mean) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    commands = []
    for row in spec.rows:
        key = row_key(spec, row)
        mine = [r for r in results if r["row"] == row.name and r.get("key") == key]
        paper = f"{row.paper:.2f}" if row.paper is not None else "-"
        flags = f"`{shlex.join(to_argv(row.train))}`" if row.train else "(none)"
        head = f"| {row.label} | {flags} | {paper} |"
        if not mine:
            lines.append(f"{head} not yet measured | not yet measured | 0/{len(spec.seeds)} | - | - |")
        else:
            seeds = sorted(r["seed"] for r in mine)
            steps = statistics.mean(r["steps"] for r in mine)
            minutes = statistics.mean(r["train_s"] for r in mine) / 60
            lines.append(f"{head} {mean_std([r['test_acc'] for r in mine])} | "
                         f"{mean_std([r['dev_acc'] for r in mine])} | {len(mine)}/{len(spec.seeds)} "
                         f"({','.join(map(str, seeds))}) | {steps:.0f} | {minutes:.1f} |")
        commands.append(f"- {row.label}: `{train_command(spec, row)}`")
    return "\n".join(lines + ["", "Commands (one run per seed):", ""] + commands) + "\n"


def plot(spec: Spec, results: list[dict], path: Path) -> bool:
    """Dev accuracy over training steps, one line per run, one colour per row -> PNG."""
    try:
        import matplotlib  # optional: no plot without it
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the backend

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, row in enumerate(spec.rows):
        key = row_key(spec, row)
        mine = [r for r in results if r["row"] == row.name and r.get("key") == key and r.get("curve")]
        for j, r in enumerate(mine):
            steps, _, acc = zip(*r["curve"], strict=True)
            ax.plot(steps, [100 * a for a in acc], color=f"C{i % 10}", alpha=0.8,
                    label=row.label if j == 0 else None)
    if not ax.lines:
        plt.close(fig)
        return False
    ax.set_xlabel("training step")
    ax.set_ylabel("dev accuracy (%)")
    ax.set_title(f"{spec.name}: dev accuracy over training (one line per seed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_table(spec: Spec, results_path: Path) -> tuple[Path, Path | None]:
    """results/<name>.md (the table) and <name>_dev_curves.png beside the results file."""
    results = read_results(results_path)
    md = results_path.with_suffix(".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(table(spec, results), encoding="utf-8")
    png = results_path.with_name(f"{spec.name}_dev_curves.png")
    return md, (png if plot(spec, results, png) else None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the `disan experiment` options."""
    p.add_argument("spec", help="grid spec (TOML), e.g. experiments/sst5_ablation.toml")
    p.add_argument("--table", action="store_true",
                   help="print mean ± std per row, write results/<name>.md and a dev-curve PNG; no training")
    p.add_argument("--runs-dir", default="runs/experiments",
                   help="checkpoints and logs of every run, outside the repo (default runs/experiments)")
    p.add_argument("--data", default=os.environ.get("DISAN_DATA", "../shared/data"),
                   help="root of the staged data for recipe rows (default: $DISAN_DATA or ../shared/data)")
    p.add_argument("--results", metavar="JSONL", help="results file (default: next to the spec, "
                   "results/<name>.jsonl)")
    p.add_argument("--run-progress", action="store_true", help="a progress bar per run (steps), too")


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan experiment`."""
    if args.table:
        spec = load_spec(args.spec)
        results_path = Path(args.results) if args.results else spec.results_path
        print(table(spec, read_results(results_path)), end="")
        md, png = write_table(spec, results_path)
        print(f"wrote {md}" + (f" and {png}" if png else ""), file=sys.stderr)
        return 0
    spec = load_spec(args.spec, train_fields())
    runner = Runner(spec, Path(args.runs_dir), Path(args.data), args.run_progress,
                    Path(args.results) if args.results else None)
    return runner.run()

