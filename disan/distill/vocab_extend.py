"""`disan extend-vocab CKPT OUT`: a trained sentence encoder that knows words it never trained on.

A distilled student's vocabulary is the corpus's most frequent words, so a text's rarer words
(names, places, '$', which the corpus filter drops) read as UNK. Its word vectors began as static
vectors of the student's `--init` source (each word encoded on its own, PCA to the table's size)
and moved in training. This fits one linear map (least squares, with a bias) from those static
vectors to the trained rows, over the words the student knows, and gives each new word the map
of its own static vector: the row training would most likely have given it.

New words are the first `--top` of a frequency-ordered list (GloVe 6B's 400k words, from the
`train` extra) that the checkpoint lacks, plus the checkpoint's own words that carry the UNK row
(a checkpoint recovered from a bundle has some). Nothing else changes: every text without a new
word encodes exactly as before. The fit's quality (cosine of mapped to trained rows on held-out
known words) is kept in the checkpoint beside what was added.

With --unknown-rows K the last K words (the list's rarest) also stand for the words the
vocabulary still lacks: each such word always reads as the same one of them, so two texts that
share it share a row (`disan.text.tokenizer.Vocab`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from disan.text.tokenizer import UNK, Vocab
from disan.train import word_vectors as E
from disan.train.checkpoint import (
    PROVENANCE_KEYS,
    checkpoint_vocab,
    load_checkpoint,
    provenance,
    write_checkpoint,
)

HELD_OUT = 0.1  # share of the known words the fit is scored on (then refitted on all)


def fit_map(static: np.ndarray, trained: np.ndarray, seed: int = 0) -> tuple[np.ndarray, float]:
    """Least-squares map [dim+1, out] (last row: the bias) and its held-out mean cosine."""
    design = np.hstack([static, np.ones((len(static), 1))])
    order = np.random.default_rng(seed).permutation(len(static))
    held, fit = order[: int(len(order) * HELD_OUT)], order[int(len(order) * HELD_OUT):]
    trial = np.linalg.lstsq(design[fit], trained[fit], rcond=None)[0]
    pred, real = design[held] @ trial, trained[held]
    cosine = (pred * real).sum(1) / (np.linalg.norm(pred, axis=1) * np.linalg.norm(real, axis=1) + 1e-12)
    return np.linalg.lstsq(design, trained, rcond=None)[0], float(cosine.mean())


def extend_vocab(payload: dict, candidates: list[str], source: str) -> tuple[dict, dict]:
    """(the extended checkpoint, a report) of an `encoder` checkpoint `payload`, adding the
    `candidates` it lacks (in their order) with rows mapped from `source`'s static vectors."""
    if payload["config"].get("task") != "encoder":
        raise ValueError(f"extend-vocab takes a sentence encoder checkpoint (task 'encoder'), "
                         f"not '{payload['config'].get('task')}'")
    state = dict(payload["model_state"])
    table = state["embed.weight"].float().numpy()
    words = list(payload["vocab"])
    unk_rows = {i for i in range(UNK + 1, len(words)) if np.array_equal(table[i], table[UNK])}
    known = [i for i in range(UNK + 1, len(words)) if i not in unk_rows]
    have = {words[i] for i in known}
    new = list(dict.fromkeys(w for w in candidates if w and w not in have))
    if not new:
        raise ValueError("no word to add: the checkpoint has every candidate word")
    static = E.static_vectors(Vocab([words[i] for i in known] + new), table.shape[1], source).vectors
    static = np.asarray(static, dtype=np.float64)
    mapping, cosine = fit_map(static[: len(known)], table[known].astype(np.float64))
    rows = np.hstack([static[len(known):], np.ones((len(new), 1))]) @ mapping
    present = set(words)
    appended = [w for w in new if w not in present]
    words += appended
    index = {w: i for i, w in enumerate(words)}
    table = np.vstack([table, np.zeros((len(appended), table.shape[1]), dtype=table.dtype)])
    table[[index[w] for w in new]] = rows
    trainable = state["trainable_rows"]
    state["embed.weight"] = torch.from_numpy(table.astype(np.float32))
    # Mapped rows are not trained ones: a further phase (--init-from) keeps them where they are.
    state["trainable_rows"] = torch.cat([trainable, torch.zeros(len(appended), dtype=trainable.dtype)])
    config = dict(payload["config"]) | {"vocab_size": len(words)}
    report = {"source": source, "candidates": len(candidates), "added": len(appended),
              "unk_rows_filled": len(new) - len(appended), "fit_words": len(known),
              "fit_heldout_cosine": round(cosine, 4)}
    return {**payload, "config": config, "vocab": words, "model_state": state}, report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a sentence encoder checkpoint (disan pretrain)")
    parser.add_argument("out", type=Path, help="where to write the extended checkpoint")
    parser.add_argument("--top", type=int, default=50_000,
                        help="candidates: the first N words of GloVe 6B's frequency-ordered list")
    parser.add_argument("--source", choices=E.STATIC_SOURCES,
                        help="static word vectors to map (default: the checkpoint's --init)")
    parser.add_argument("--unknown-rows", type=int, default=0, metavar="K",
                        help="the last K words of the extended vocabulary also stand for the words it "
                             "still lacks, each unknown word always the same one (a hash of its "
                             "spelling; `disan.text.tokenizer.Vocab`); 0: unknown words read as UNK")


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ValueError(f"--top {args.top}: give how many list words to consider (at least 1)")
    if args.unknown_rows < 0:
        raise ValueError(f"--unknown-rows {args.unknown_rows}: give how many rows (0: none)")
    payload = load_checkpoint(args.checkpoint)
    source = args.source or (payload.get("train_config") or {}).get("init")
    if source not in E.STATIC_SOURCES:
        raise ValueError(f"{args.checkpoint}: its word vectors did not start from "
                         f"{' or '.join(E.STATIC_SOURCES)} (--init {source}); name one with --source")
    candidates = E.load_glove_package().words[: args.top]
    extended, report = extend_vocab(payload, candidates, source)
    extended.pop("unknown_rows", None)  # an input's K named its own last rows, not these
    if args.unknown_rows:
        checkpoint_vocab({**extended, "unknown_rows": args.unknown_rows})  # raises past the word count
        extended["unknown_rows"] = args.unknown_rows
    report["unknown_rows"] = args.unknown_rows
    # The optimizer's and the training wrapper's state (a last.pt's) no longer fit the new table;
    # where the input came from moves under `vocab_extension`: this file was made, not recovered.
    dropped = ("optimizer_state", "student_state", *PROVENANCE_KEYS)
    out = {k: v for k, v in extended.items() if k not in dropped}
    origin = provenance(args.checkpoint, payload)
    out["vocab_extension"] = report | {"list": f"GloVe 6B, first {args.top} words", "from": origin}
    write_checkpoint(args.out, out)
    print(f"{args.out}: {report['added']} words added, {report['unk_rows_filled']} UNK rows filled "
          f"(map fitted on {report['fit_words']} words, held-out cosine {report['fit_heldout_cosine']}); "
          f"unknown words read as {f'the last {args.unknown_rows} words' if args.unknown_rows else 'UNK'}")
    return 0
