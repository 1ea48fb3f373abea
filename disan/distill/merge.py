"""`disan merge START PHASE [PHASE ...] --control CONTROL --scale S --out OUT`: a student's
weights plus the change a further phase made to them, less the change a control phase made (task
arithmetic, Ilharco et al. 2023):

    out = start + S * (phase - control)        (without --control: start + S * (phase - start))

With several phases, `phase` is their mean: seeds of one phase from the same start, averaged (a
uniform model soup, Wortsman et al. 2022). Why: a phase's lead on a dev set can be its seed's luck;
the mean of every seed's weights is not picked among them, and it usually scores at least the mean
of its members.

Why: every further phase from a trained student drifts on what it was selected on (STS-B dev),
with or without a new loss, so the new loss's gain arrives with the drift. A control phase run
with the same flags, seed and batches but without the new loss makes the same drift; the
difference of the two is what the new loss changed. Without a control, S below 1 interpolates
between the start and the phase (WiSE-FT).

`--keep-words` keeps the start's word table as it is: a bundle's NLI and sentiment models read
the embedding encoder's table (`disan borrow-words`), so with it they stay byte-identical. The
three checkpoints must share the start's config and vocabulary; the result names all of them
(`merge`, with sha256), so a bundle exported from it says where its weights came from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from disan.train.checkpoint import RESUME_STATE, load_checkpoint, provenance, write_checkpoint

WORD_TABLE = "embed.weight"
# What the merged weights were not trained with: the start's resume state (as `disan slim` drops
# it), its best record, its flags, and its as-trained metrics and step, which describe the start's
# weights, not the merge's (a bundle's manifest would show them as the served model's).
TRAINING_STATE = (*RESUME_STATE, "best", "train_config", "metrics", "step", "epoch")


def _same_shape(start: dict, other: dict, name: str) -> None:
    if other["config"] != start["config"]:
        raise ValueError(f"{name}: another model shape than the start's "
                         f"({other['config']} vs {start['config']})")
    if other["vocab"] != start["vocab"]:
        raise ValueError(f"{name}: another vocabulary than the start's")


def _mean_state(base: dict, phases: list[Path]) -> tuple[dict, list[dict]]:
    """The phases' floating-point weights averaged, and each phase's provenance. One phase is
    loaded at a time, so the memory does not grow with the number of seeds."""
    total: dict = {}
    named = []
    for path in phases:
        ckpt = load_checkpoint(path)
        _same_shape(base, ckpt, str(path))
        named.append(provenance(path, ckpt))
        for key, value in ckpt["model_state"].items():
            if value.is_floating_point():
                total[key] = total[key] + value.float() if key in total else value.float()
        del ckpt
    return {key: value / len(phases) for key, value in total.items()}, named


def merge(start: Path, phase: Path | list[Path], out: Path, control: Path | None = None,
          scale: float = 1.0, keep_words: bool = False) -> dict:
    """Write the merged checkpoint to `out`; returns its `merge` record. `phase`: one checkpoint,
    or several whose weights are averaged (the record's `phase` then lists them all)."""
    phases = phase if isinstance(phase, list) else [phase]
    if not phases:
        raise ValueError("name at least one phase")
    if out.resolve() in {p.resolve() for p in (start, *phases, control) if p}:
        raise ValueError(f"{out} is one of the inputs; name another file")
    base = load_checkpoint(start)
    mean, named = _mean_state(base, phases)
    ref = base
    if control is not None:
        ref = load_checkpoint(control)
        _same_shape(base, ref, str(control))
    state = {}
    for key, value in base["model_state"].items():
        if not value.is_floating_point() or (keep_words and key == WORD_TABLE):
            state[key] = value
            continue
        delta = mean[key] - ref["model_state"][key].float()
        state[key] = (value.float() + scale * delta).to(value.dtype)
    record = {"start": provenance(start, base), "phase": named[0] if len(named) == 1 else named,
              "control": provenance(control, ref) if control else None, "scale": scale,
              "keep_words": keep_words}
    payload = {k: v for k, v in base.items() if k not in TRAINING_STATE}
    write_checkpoint(out, payload | {"model_state": state, "merge": record})
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("start", type=Path,
                        help="the student both phases went on from (its encoder checkpoint)")
    parser.add_argument("phase", type=Path, nargs="+",
                        help="the phase with the change to keep; several (seeds of one phase from "
                             "the same start) are averaged")
    parser.add_argument("--control", type=Path, default=None,
                        help="the same phase without that change (same flags and seed); "
                             "without it the start is the reference")
    parser.add_argument("--scale", type=float, default=1.0, help="how much of the difference to add")
    parser.add_argument("--keep-words", action="store_true",
                        help="keep the start's word table (task models that borrow it stay the same)")
    parser.add_argument("--out", type=Path, required=True)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.scale <= 4:
        raise ValueError(f"--scale must be in (0, 4], not {args.scale}")
    record = merge(args.start, args.phase, args.out, args.control, args.scale, args.keep_words)
    against = f" - {args.control}" if record["control"] else f" - {args.start}"
    moved = f"mean({', '.join(map(str, args.phase))})" if len(args.phase) > 1 else str(args.phase[0])
    print(f"{args.out}: {args.start} + {args.scale} x ({moved}{against})")
    return 0
