"""An encoder checkpoint whose head serves whitened vectors.

The embed route's vector is a linear head over DiSAN's 2*d_h sentence vector, and its directions are
far from equal: the first few principal directions carry most of the variance, so a cosine reads
mostly them, and the quiet ones (where a specific term or entity shows) count for little. This folds
into the head the map to the vectors' own principal coordinates (uncentred unless `--centre`, as
the bundle's `dimensions.npy` axes are; fitted on corpus texts, none from an evaluation set), each
scaled by singular value^-P, keeping the first k: the served vector is then k wide (k <= 2*d_h + 1,
the directions a linear head over 2*d_h can have), and the graphs change only in the head's width.

    python -m research.whiten_head --checkpoint R/embed.pt --corpus CORPUS --power 0.5 --out W.pt

A checkpoint whose head already ends in a normalisation (a whitened, served one) is whitened again
on its vectors before that normalisation: its own principal axes at the new power, on top of the
old (`--unit-length` keeps the normalisation).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from disan.distill.corpus.build import read_corpus
from disan.distill.loop import encode_texts
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint, write_checkpoint


def whitening(vectors: np.ndarray, power: float, k: int, centre: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
    """(mean [D], map [k, D]): x -> map @ (x - mean) gives the first k principal coordinates of
    `vectors` (about their mean with `centre`, else about 0), each scaled by (its singular value /
    the first's)^-power."""
    mean = vectors.mean(0) if centre else np.zeros(vectors.shape[1])
    _, sv, axes = np.linalg.svd(vectors - mean, full_matrices=False)
    return mean, axes[:k] * ((sv[:k] / sv[0]) ** -power)[:, None]


def fold(weight: np.ndarray, bias: np.ndarray, mean: np.ndarray, linear: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray]:
    """The head x -> linear @ (weight @ x + bias - mean) as one (weight, bias)."""
    return linear @ weight, linear @ (bias - mean)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="an encoder checkpoint (embed.pt)")
    parser.add_argument("--corpus", type=Path, required=True, help="a `disan distill corpus` folder")
    parser.add_argument("--power", type=float, default=0.5)
    parser.add_argument("--centre", action="store_true", help="principal coordinates about the mean")
    parser.add_argument("--keep-width", action="store_true",
                        help="turn the scaled coordinates back into the head's own D axes: the same "
                             "cosines, D wide, each component a mix as before")
    parser.add_argument("--unit-length", action="store_true",
                        help="end the encoder in an L2 normalisation (DiSANConfig.unit_length): the same "
                             "cosines, every raw vector of length 1")
    parser.add_argument("--dims", type=int, default=300, help="k: the served width")
    parser.add_argument("--rows", type=int, default=20_000, help="corpus texts the axes are fitted on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    payload = load_checkpoint(args.checkpoint)
    model, vocab, _ = model_from_checkpoint(payload)
    encoder = getattr(model, "encoder", model)
    if encoder.proj is None:
        parser.error(f"{args.checkpoint}: no head (proj) to fold the whitening into")
    # a head that ends in a normalisation is whitened again on its vectors before it (the same cosines):
    # those are the linear map of the blocks' output that the fold below rewrites
    encoder.cfg.unit_length = False
    texts, _ = read_corpus(args.corpus)
    chosen = np.random.default_rng(args.seed).choice(len(texts), min(args.rows, len(texts)), replace=False)
    with torch.no_grad():
        vectors = encode_texts(encoder, vocab, [texts[i] for i in chosen]).astype(np.float64)
    if args.dims > min(vectors.shape):
        parser.error(f"--dims {args.dims}: at most {min(vectors.shape)} here")
    mean, linear = whitening(vectors, args.power, args.dims, args.centre)
    if args.keep_width:  # the map's rows are the unit axes scaled: axes.T @ coordinates keeps every cosine
        axes = linear / np.linalg.norm(linear, axis=1, keepdims=True)
        linear = axes.T @ linear
    state = payload["model_state"]
    weight, bias = fold(state["proj.weight"].double().numpy(), state["proj.bias"].double().numpy(),
                        mean, linear)
    state["proj.weight"] = torch.from_numpy(weight).to(state["proj.weight"].dtype)
    state["proj.bias"] = torch.from_numpy(bias).to(state["proj.bias"].dtype)
    payload["config"]["proj_dim"] = len(weight)
    payload["config"]["unit_length"] = args.unit_length
    payload["whitened"] = {"from": args.checkpoint.name, "power": args.power, "dims": args.dims,
                           "centre": args.centre, "keep_width": args.keep_width,
                           "unit_length": args.unit_length, "rows": len(chosen),
                           "seed": args.seed}
    # the map itself, for a phase distilled in these coordinates (`disan distill student
    # --whiten-targets`); not provenance, so no manifest carries it
    payload["whitening"] = {"mean": torch.from_numpy(mean).float(),
                            "linear": torch.from_numpy(linear).float()}
    write_checkpoint(args.out, payload)
    print(f"{args.out}: head {tuple(weight.shape)}, power {args.power}, fitted on {len(chosen)} corpus texts")
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.whiten_head"))
