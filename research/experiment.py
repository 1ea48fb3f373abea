"""`disan experiment`: run a grid of `disan train` configurations x seeds, resumably; tabulate it.

    python -m research experiment research/experiments/sst5_ablation.toml          # run (or resume) it
    python -m research experiment research/experiments/sst5_ablation.toml --table  # mean ± std -> .md

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
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import disan.cli  # torch-free; each run is `disan train` in this process
from research.experiment_spec import Row, Spec, load_spec, row_key, row_options, to_argv, train_fields
from research.experiment_table import read_results, table, write_table


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
        from disan.train.checkpoint import load_checkpoint  # torch: only once a run has finished

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the `disan experiment` options."""
    p.add_argument("spec", help="grid spec (TOML), e.g. research/experiments/sst5_ablation.toml")
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

