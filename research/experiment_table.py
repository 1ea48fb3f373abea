"""The tables of `disan experiment --table`: mean ± std per row over its finished seeds, and dev curves."""

from __future__ import annotations

import contextlib
import json
import shlex
import statistics
from pathlib import Path

from research.experiment_spec import Spec, row_key, to_argv, train_command


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
