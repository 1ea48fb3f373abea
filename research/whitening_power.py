"""Another whitening power for a whitened head, without the corpus it was fitted on, and the dev
sets scored at each power and first-window weight (`lead`).

`research.whiten_head` folds a map A.T @ diag((s / s0)^-P) @ A into the head (A: the principal
axes of the head's vectors, s their singular values; `--keep-width`). The head before (W) and after
(L @ W) give L back on the head's span, and its eigenvectors and eigenvalues give A and s / s0: so a
map at any other power is a few lines away, with no corpus and no teacher. Every power and lead is
then scored from one pass of the bundle before the whitening (its window vectors, mapped, each at
unit length as a `--unit-length` head serves them, then pooled as the embed route pools them).

    python -m model_export.recover BEFORE R0 && python -m model_export.recover AFTER R1
    python -m research.whitening_power --bundle BEFORE --before R0/embed.pt --after R1/embed.pt \
        --power 0.25 --powers 0.25 0.3 0.5 --leads 2 3 --data $D --transfer --out grid.json

`--write P OUT` writes the encoder whitened at power P instead (the --after checkpoint with its head
folded again from --before's, and the map for `disan distill student --whiten-targets`), ready for
`disan export`: a chosen power becomes a bundle without the corpus the first whitening was fitted on.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from disan.data.sts import sts_scores
from disan.eval.retrieval import load_set, metrics, run_of, top_k, unit_rows
from disan.runtime.encoder import Encoder
from disan.text.prepare import pool
from disan.train.checkpoint import load_checkpoint, write_checkpoint


def head_matrix(state: dict) -> np.ndarray:
    """[D, H + 1]: the head's weight with its bias as the last column (float64)."""
    return np.concatenate([state["proj.weight"].double().numpy(),
                           state["proj.bias"].double().numpy()[:, None]], axis=1)


def spectrum_between(before: np.ndarray, after: np.ndarray, power: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(s / s0 [k], axes [k, D]) of the whitening at `power` that turned head `before` into
    `after` (head_matrix of each), the axes in the order of their singular values."""
    folded = after @ np.linalg.pinv(before)
    eigenvalues, vectors = np.linalg.eigh((folded + folded.T) / 2)
    kept = eigenvalues > 0.5  # a kept axis scales by (s / s0)^-P >= 1; the head's other directions by 0
    ratios = eigenvalues[kept] ** (-1.0 / power)
    order = np.argsort(-ratios)
    return ratios[order], vectors[:, kept][:, order].T


def map_at(ratios: np.ndarray, axes: np.ndarray, power: float, floor: float = 0.0, ceiling: float = 1.0
           ) -> np.ndarray:
    """[D, D]: the whitening at `power` in the head's own axes (research.whiten_head --keep-width).
    The ratios are clipped to [floor, ceiling] first: axes under the floor are raised no further
    than one at the floor (the quiet tail keeps its own shape), axes over the ceiling all scale as
    one at the ceiling (the loud top keeps its own shape, only what is under it is raised)."""
    return (axes.T * np.clip(ratios, floor, ceiling) ** -power) @ axes


def label(power: float, floor: float = 0.0, ceiling: float = 1.0) -> str:
    """A grid cell's name: "P 0.5", with ", floor 0.1" or ", ceiling 0.3" where the ratios are clipped."""
    clips = (f", floor {floor}" if floor else "") + (f", ceiling {ceiling}" if ceiling < 1 else "")
    return f"P {power}{clips}"


class WindowCache:
    """The bundle's raw window vectors of each text, embedded once."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder, self.memo = encoder, {}

    def encode(self, texts: Sequence[str], linear: np.ndarray, lead: float) -> np.ndarray:
        """Each text as a `--unit-length` head with `linear` folded in serves it, windows pooled
        with the first one's weight times `lead`."""
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if missing:
            prepared = self.encoder.prepare(missing)
            rows, start = self.encoder.embed_rows(prepared.rows), 0
            for text, item in zip(missing, prepared.items or [], strict=True):
                self.memo[text] = (item, rows[start:start + len(item.rows)])
                start += len(item.rows)
        got = [self.memo[t] for t in texts]
        rows = unit_rows(np.concatenate([r for _, r in got]) @ linear.T.astype(np.float32))
        return pool([item for item, _ in got], rows, lead)


def power_encoders(bundle: Path, before: Path, after: Path, power: float, powers: Sequence[float],
                   threads: int = 0) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """{"P p": texts -> vectors} of `bundle` (the one before the whitening) whitened at each of
    `powers`, read back from the encoders `before` and `after` (whitened at `power`), windows
    pooled with lead 2 as served; one pass of the bundle serves them all."""
    heads = (head_matrix(load_checkpoint(p)["model_state"]) for p in (before, after))
    ratios, axes = spectrum_between(*heads, power)
    cache = WindowCache(Encoder(bundle, threads=threads))
    return {label(p): (lambda t, m=map_at(ratios, axes, p): cache.encode(t, m, 2.0)) for p in powers}


def grid(cache: WindowCache, maps: dict[str, np.ndarray], leads: Sequence[float], folders: Sequence[Path],
         data: Path | None, transfer: bool, log: Callable[[str], None] = print) -> dict:
    """{set: {"NAME, lead l": metrics}} for retrieval, {"sts"|"transfer": {NAME: scores}} for each
    map's NAME (queries, STS and transfer texts pooled with lead 2, as served)."""
    from disan.eval.transfer import evaluate_encoder  # scikit-learn (`train`)

    report: dict = {}
    for folder in folders:
        dataset = load_set(folder)
        report[folder.name] = {}
        for name, linear in maps.items():
            queries = unit_rows(cache.encode(dataset.queries, linear, 2.0))
            for lead in leads:
                idx, scores = top_k(queries, unit_rows(cache.encode(dataset.docs, linear, lead)))
                found = metrics(dataset.qrels, run_of(dataset, idx, scores))
                cell = {k: round(v, 4) for k, v in found.items()}
                report[folder.name][f"{name}, lead {lead}"] = cell
                log(f"{folder.name} {name}, lead {lead}: {cell}")
    if data is not None:
        report["sts"] = {name: {k: round(v, 4) for k, v in
                                sts_scores(lambda t, m=m: cache.encode(t, m, 2.0), data).items()}
                         for name, m in maps.items()}
        log(f"sts: {report['sts']}")
        if transfer:
            report["transfer"] = {name: evaluate_encoder(lambda t, m=m: cache.encode(t, m, 2.0),
                                                         data / "senteval") for name, m in maps.items()}
            log(f"transfer: {report['transfer']}")
    return report


def write_at(after: Path, before_head: np.ndarray, linear: np.ndarray, provenance: dict, out: Path) -> None:
    """The checkpoint `after` with its head replaced by `linear` @ `before_head` (head_matrix of the
    encoder before the whitening) and `linear` as its whitening map, written to `out`."""
    payload = load_checkpoint(after)
    folded, state = linear @ before_head, payload["model_state"]
    state["proj.weight"] = torch.from_numpy(folded[:, :-1].copy()).to(state["proj.weight"].dtype)
    state["proj.bias"] = torch.from_numpy(folded[:, -1].copy()).to(state["proj.bias"].dtype)
    payload["whitened"] = {**provenance, "keep_width": True, "unit_length": True}
    payload["whitening"] = {"mean": torch.zeros(len(linear)), "linear": torch.from_numpy(linear).float()}
    write_checkpoint(out, payload)


def add_read_back_arguments(parser: argparse.ArgumentParser, powers_help: str, **powers: object) -> None:
    """The flags every tool that reads a whitening back takes: the bundle before it, the encoders
    before and after it, the power it was made at, and the powers to score (`powers`: their default
    or `required=True`)."""
    parser.add_argument("--bundle", type=Path, required=True, help="the bundle before the whitening")
    parser.add_argument("--before", type=Path, required=True, help="its encoder (model_export.recover)")
    parser.add_argument("--after", type=Path, required=True, help="the whitened encoder")
    parser.add_argument("--power", type=float, required=True, help="the power --after was whitened at")
    parser.add_argument("--powers", type=float, nargs="+", help=powers_help, **powers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_read_back_arguments(parser, "the powers scored", default=[0.25, 0.5])
    parser.add_argument("--floors", type=float, nargs="+", default=[0.0],
                        help="s / s0 below which an axis is raised no further (0: every axis, as "
                             "research.whiten_head does); each power is scored at each floor")
    parser.add_argument("--ceilings", type=float, nargs="+", default=[1.0],
                        help="s / s0 above which every axis scales as one at it (1: none); each power "
                             "and floor is scored at each ceiling")
    parser.add_argument("--leads", type=float, nargs="+", default=[2.0])
    parser.add_argument("--retrieval", type=Path, nargs="*", default=[], help="BEIR-layout folders")
    parser.add_argument("--data", type=Path, default=None, help="the staged data: STS sets (and transfer)")
    parser.add_argument("--transfer", action="store_true", help="also the transfer tasks (needs --data)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="the report as JSON")
    parser.add_argument("--write", nargs=2, metavar=("P", "OUT"), default=None,
                        help="write the encoder whitened at power P to OUT instead of scoring")
    args = parser.parse_args(argv)
    try:
        write_power = None if args.write is None else float(args.write[0])
    except ValueError:
        parser.error(f"--write {args.write[0]}: a power (a number) expected")
    before, after = (head_matrix(load_checkpoint(p)["model_state"]) for p in (args.before, args.after))
    if before.shape[1] != after.shape[1]:
        parser.error(f"{args.after}: its head does not read the same {before.shape[1] - 1} inputs")
    ratios, axes = spectrum_between(before, after, args.power)
    print(f"{len(ratios)} axes, s / s0 from 1 to {ratios[-1]:.3g}; "
          f"reproduced within {np.abs(map_at(ratios, axes, args.power) @ before - after).max():.2g}")
    if write_power is not None:
        provenance = {"from": args.before.name, "power": write_power, "read_back_from": args.after.name,
                      "read_back_power": args.power}
        write_at(args.after, before, map_at(ratios, axes, write_power), provenance, Path(args.write[1]))
        print(f"{args.write[1]}: head whitened at power {write_power}")
        return 0
    maps = {label(p, f, c): map_at(ratios, axes, p, f, c)
            for p in args.powers for f in args.floors for c in args.ceilings}
    cache = WindowCache(Encoder(args.bundle, threads=args.threads))
    report = grid(cache, maps, args.leads, args.retrieval, args.data, args.transfer)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.whitening_power"))
