"""A corpus with inverse-cloze pairs beside its own: one sentence of a passage -> the rest of that
passage (Lee et al. 2019's pre-training for retrieval), so the pairs teach query -> passage on every
source that has passages, not only on the sources with titles.

    python -m research.cloze_pairs CORPUS OUT [--limit N] [--seed S]

The new texts (each chosen sentence and its passage without it) are appended after the corpus's
rows, so the corpus's first rows, which `disan distill student --anchor 1` trains on, stay the same.
Passages of fewer than three sentences are left out: the rest is at least two sentences. Every
appended text is made of the corpus's own sentences, which `disan distill corpus` already checked
against the evaluation texts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from disan.distill.corpus.build import PASSAGE, SENTENCE, read_corpus, split_sentences

RELATION = "cloze"


def cloze_rows(texts: list[str], kinds: np.ndarray, rows: int, seed: int, limit: int
               ) -> tuple[list[str], list[int], list[tuple[int, int]]]:
    """(new texts, their kinds, (query row, passage row) pairs) for passages of three sentences or
    more, in a seeded order; rows are numbered from `rows` on."""
    rng = np.random.default_rng(seed)
    new_texts: list[str] = []
    new_kinds: list[int] = []
    pairs: list[tuple[int, int]] = []
    for row in rng.permutation(np.flatnonzero(kinds == PASSAGE)):
        if len(pairs) >= limit:
            break
        parts = split_sentences(texts[row])
        if len(parts) < 3:
            continue
        i = int(rng.integers(len(parts)))
        query = rows + len(new_texts)
        new_texts += [parts[i], " ".join(parts[:i] + parts[i + 1:])]
        new_kinds += [SENTENCE, PASSAGE]
        pairs.append((query, query + 1))
    return new_texts, new_kinds, pairs


def add_cloze_pairs(corpus: Path, out: Path, seed: int = 0, limit: int = 10**9) -> dict:
    """Write CORPUS plus its cloze pairs to OUT; return OUT's description (corpus.json)."""
    texts, info = read_corpus(corpus)
    kinds = np.load(corpus / "kinds.npy")
    pairs = np.load(corpus / "pairs.npy")
    if RELATION in info["relations"]:
        raise ValueError(f"{corpus} already has {RELATION} pairs")
    new_texts, new_kinds, new_pairs = cloze_rows(texts, kinds, len(texts), seed, limit)
    relation = len(info["relations"])
    table = np.asarray([(q, p, relation) for q, p in new_pairs], np.int32).reshape(-1, 3)
    out.mkdir(parents=True, exist_ok=True)
    body = "".join(t + "\n" for t in texts + new_texts).encode("utf-8")
    (out / "sentences.txt").write_bytes(body)
    all_kinds = np.concatenate([kinds, np.asarray(new_kinds, np.uint8)])
    np.save(out / "kinds.npy", all_kinds)
    np.save(out / "pairs.npy", np.concatenate([pairs, table]).astype(np.int32))
    info.update(sentences=len(texts) + len(new_texts), sha256=hashlib.sha256(body).hexdigest(),
                pairs=int(len(pairs) + len(table)),
                kinds={k: int((all_kinds == i).sum()) for i, k in enumerate(info["kinds"])},
                relations={**info["relations"], RELATION: len(table)},
                cloze={"from": str(corpus.name), "seed": seed, "pairs": len(table)})
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="a `disan distill corpus` folder")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=10**9, help="at most this many cloze pairs")
    args = parser.parse_args(argv)
    info = add_cloze_pairs(args.corpus, args.out, args.seed, args.limit)
    print(f"{info['cloze']['pairs']} cloze pairs, {info['sentences']} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.cloze_pairs"))
