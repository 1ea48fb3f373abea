"""Where the teacher keeps what the TREC probe reads, and which of it a student kept.

The teacher's vectors of the corpus have principal directions, loudest first. This fits the
transfer probe (`disan.eval.transfer`'s logistic regression on trec_train, scored on trec_test) on the
teacher's TREC vectors cut to their top k principal coordinates, and to all but those; then,
for each student, how well its vector predicts each band of those coordinates (ridge fitted on
trec_train, R^2 on trec_test). A student that keeps only the loud bands loses what the probe
reads in the quiet ones (docs/distillation.md, "Directions the student does not learn").

    python -m research.analyses.teacher_directions --corpus runs/corpus --teacher mpnet \\
        --checkpoint runs/recovered/embed.pt --data ../shared/data
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.linear_model import Ridge

from bench.report import run_and_report
from disan.data.readers import read_jsonl
from disan.distill.teacher import TeacherCache
from disan.distill.whitening import principal_axes
from disan.eval.transfer import BASELINES, checkpoint_encoder, classifier

CUTS = (16, 32, 64, 128, 256)
BANDS = ((0, 16), (16, 64), (64, 128), (128, 256), (256, 512), (512, 768))


def probe_accuracy(x: np.ndarray, y: np.ndarray, n_train: int) -> float:
    """The transfer probe on the first n_train rows, accuracy (percent) on the rest."""
    probe = classifier("fixed").fit(x[:n_train], y[:n_train])
    return round(100 * float(probe.score(x[n_train:], y[n_train:])), 2)


def band_r2(student: np.ndarray, coords: np.ndarray, n_train: int, bands=BANDS) -> dict[str, float]:
    """Mean R^2 on the held-out rows of a ridge map student -> each band of teacher coordinates."""
    fit = Ridge(alpha=1.0).fit(student[:n_train], coords[:n_train])
    pred, held = fit.predict(student[n_train:]), coords[n_train:]
    r2 = 1 - ((pred - held) ** 2).sum(0) / ((held - coords[:n_train].mean(0)) ** 2).sum(0)
    return {f"{a}-{b}": round(float(r2[a:b].mean()), 3) for a, b in bands if a < coords.shape[1]}


def run(args: argparse.Namespace) -> dict:
    if args.teacher not in BASELINES:
        raise SystemExit(f"--teacher {args.teacher}: one of {', '.join(BASELINES)}")
    trec = args.data / "senteval" / "TREC"
    try:
        cache = TeacherCache.read(args.corpus / f"teacher-{args.teacher}").vectors()
        train, test = (read_jsonl(trec / f"trec_{split}.jsonl.gz") for split in ("train", "test"))
    except (ValueError, FileNotFoundError) as e:  # a missing cache or data: one line, not a traceback
        raise SystemExit(str(e)) from None
    mean, singular, basis = principal_axes(cache)
    texts, n = [r["text"] for r in train + test], len(train)
    y = np.array([r["label"] for r in train + test])
    teacher = BASELINES[args.teacher][1]()(texts)
    unit = teacher / np.maximum(np.linalg.norm(teacher, axis=1, keepdims=True), 1e-12)
    coords = (unit - mean) @ basis.T  # [N, k], loudest direction first
    share = (singular ** 2) / (singular ** 2).sum()
    cuts = [c for c in CUTS if c < coords.shape[1]]
    results = {"teacher": args.teacher, "trec_teacher": probe_accuracy(teacher, y, n),
               "variance_share": {f"{a}-{b}": round(float(share[a:b].sum()), 3) for a, b in BANDS
                                  if a < len(share)},
               "trec_top_k": {k: probe_accuracy(coords[:, :k], y, n) for k in cuts},
               "trec_without_top_k": {k: probe_accuracy(coords[:, k:], y, n) for k in cuts},
               "students": {}}
    for path in args.checkpoint:
        student = checkpoint_encoder(path)(texts)
        results["students"][str(path)] = {"trec": probe_accuracy(student, y, n),
                                          "r2_by_band": band_r2(student, coords, n)}
        print(path, results["students"][str(path)], flush=True)
    return results


def _row(label: str, values, fmt: str) -> str:
    return f"| {label} | " + " | ".join(format(v, fmt) for v in values) + " |"


def markdown(results: dict) -> str:
    cuts, bands = list(results["trec_top_k"]), list(results["variance_share"])
    lines = [_row("teacher's TREC from", cuts, ""), _row("---", ["---"] * len(cuts), ""),
             _row("its top k principal coordinates", results["trec_top_k"].values(), ".2f"),
             _row("all but its top k", results["trec_without_top_k"].values(), ".2f"),
             f"\nall {results['teacher']} coordinates: TREC {results['trec_teacher']:.2f}\n",
             _row("R^2 of the teacher's coordinates, by band", ["TREC", *bands], ""),
             _row("---", ["---"] * (len(bands) + 1), ""),
             _row("(the band's share of the teacher's variance)",
                  ["", *results["variance_share"].values()], "")]
    for path, row in results["students"].items():
        lines.append(_row(path, [f"{row['trec']:.2f}", *(f"{row['r2_by_band'][b]:.3f}" for b in bands)], ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True,
                        help="a `disan corpus` folder with a teacher cache")
    parser.add_argument("--teacher", default="mpnet", help="the cache teacher-NAME, encoded again for TREC")
    parser.add_argument("--checkpoint", type=Path, nargs="*", default=[], help="student checkpoints to score")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--json", type=Path,
                        default=Path("research/analyses/results/teacher_directions.json"))
    return run_and_report(parser, run, markdown, argv)


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.teacher_directions"))
