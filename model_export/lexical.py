"""A lexical table for a bundle: the IDF its sparse vectors weigh token ids by (`POST /embed_sparse`).

Why: hybrid search. A dense vector keeps meaning and loses the exact rare word a query and its
document share; the sparse vector keeps it (disan.bundle.lexical), and a search that adds the two
scores finds both.

How: the `--texts` (one per line; plain or gzipped; every `--every`-th distinct line, at most
`--max-texts`) tokenized as the embed route reads them, how many hold each id, and the smoothed
IDF of every id rounded to 2**`--bits` levels, stored in `lexical.npz`; the manifest gains
`lexical` (the file, the levels' scale, how many texts and their sha256). Nothing else changes:
`disan bundle-diff` reports every route the same. Pick a general corpus, none of the sets you
evaluate on.

    python -m model_export.lexical models/default --texts corpus/sentences.txt --every 5 --bits 2
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from disan.bundle.lexical import LEXICAL_FILE, WEIGHTING, document_frequency, idf_levels
from disan.bundle.manifest import read_manifest_json, write_manifest
from model_export.dimensions import read_texts

CHUNK = 20_000  # texts tokenized at a time


def corpus_frequency(encoder, texts: list[str]) -> np.ndarray:
    """How many of `texts` hold each embed token id (every window of a long text), int64 [ids],
    `CHUNK` texts tokenized at a time."""
    size = len(encoder.runtime.tokenizer("embed"))
    df = np.zeros(size, np.int64)
    for start in range(0, len(texts), CHUNK):
        items = encoder.prepare(texts[start:start + CHUNK]).items or []
        df += document_frequency([item.ids for item in items], size)
    return df


def add_lexical(bundle: Path, texts: list[str], bits: int = 2) -> dict:
    """Count, quantise and write the table and the manifest entry (module docstring); returns it."""
    from disan.runtime.encoder import Encoder  # onnxruntime: only this step needs it

    if not texts:
        raise ValueError("no texts: the IDF needs a corpus")
    manifest = read_manifest_json(bundle)
    encoder = Encoder(bundle, long_texts="window")
    df = corpus_frequency(encoder, texts)
    levels, scale = idf_levels(df, len(texts), bits)
    with open(bundle / LEXICAL_FILE, "wb") as fh:
        np.savez_compressed(fh, levels=levels)
    entry = {"file": LEXICAL_FILE, "ids": len(levels), "bits": bits, "scale": scale, "weighting": WEIGHTING,
             "ids_seen": int((df > 0).sum()), "fit_texts": len(texts),
             "fit_sha256": hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()}
    write_manifest(bundle, {**manifest, "lexical": entry})
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export.lexical",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--texts", type=Path, nargs="+", required=True,
                        help="files of texts, one per line (.gz too): a general corpus")
    parser.add_argument("--every", type=int, default=1, help="read every Nth distinct non-empty line")
    parser.add_argument("--max-texts", type=int, default=None, help="use at most this many texts")
    parser.add_argument("--bits", type=int, default=2, help="IDF levels: 2**bits (default 2: four levels)")
    args = parser.parse_args(argv)
    try:
        texts = read_texts(args.texts, args.max_texts, args.every)
        entry = add_lexical(args.bundle, texts, args.bits)
    except (OSError, ValueError) as exc:  # BundleError too
        print(f"lexical: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.bundle}: {entry['file']}, {entry['ids']} ids ({entry['ids_seen']} seen) from "
          f"{entry['fit_texts']} texts, {2 ** entry['bits']} levels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
