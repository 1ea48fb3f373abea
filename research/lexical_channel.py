"""A lexical channel beside the dense vector: does a hashed, IDF-weighted bag of the bundle's own
tokens, concatenated to the DiSAN vector, close the retrieval gap, and what does it cost STS?

    python -m research.lexical_channel --bundle models/default --data ../shared/data \
        --idf-corpus CORPUS/sentences.txt --dims 768 --weights 0 0.1 0.2 0.3 0.5 --out R.json

Each text becomes `[sqrt(1 - w) * dense / |dense|, sqrt(w) * lex / |lex|]`: a unit vector whose dot
product with another is `(1 - w) * dense cosine + w * lexical cosine`, so any cosine index serves the
mix. `lex` sums, over the text's token ids (whole words and pieces, as the encoder reads them, all
windows of a long text), `idf[id] * (1 + log count)` into `--dims` buckets, each id given a fixed
bucket and sign (feature hashing). The IDF comes from a
sample of a general corpus (`--idf-corpus`, never the evaluation sets), so a bundle could ship it.
Every set is scored by the product's code (`disan.eval.retrieval.evaluate_set`, `disan.data.sts`;
`--transfer-weights`: `disan.eval.transfer.evaluate_encoder`, as `disan eval --transfer` scores).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from disan.bundle.lexical import document_frequency, smoothed_idf
from disan.data.sts import sts_scores
from disan.eval.retrieval import evaluate_set, load_set, unit_rows


def hashing(vocab_size: int, dims: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed bucket (int64) and sign (float32, +-1) for every id."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, dims, vocab_size), rng.choice(np.float32([-1.0, 1.0]), vocab_size)


def lexical_vectors(id_lists: Sequence[Sequence[int]], idf: np.ndarray, dims: int,
                    seed: int = 0) -> np.ndarray:
    """Unit rows [texts, dims] of IDF x (1 + log count) per distinct id, hashed into `dims` signed
    buckets; a text without ids is zero."""
    bucket, sign = hashing(len(idf), dims, seed)
    out = np.zeros((len(id_lists), dims), np.float32)
    for row, ids in enumerate(id_lists):
        for token, count in Counter(ids).items():
            out[row, bucket[token]] += sign[token] * idf[token] * (1.0 + math.log(count))
    return unit_rows(out)


def mixed(dense: np.ndarray, lexical: np.ndarray, weight: float) -> np.ndarray:
    """Unit rows whose dot products are (1 - weight) x the dense cosine + weight x the lexical one."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight={weight}: from 0 to 1")
    return np.concatenate([math.sqrt(1.0 - weight) * unit_rows(dense), math.sqrt(weight) * lexical], axis=1)


def sample_lines(path: Path, every: int, limit: int) -> list[str]:
    lines = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i % every == 0:
                lines.append(line.rstrip("\n"))
                if len(lines) >= limit:
                    break
    return lines


def main(argv: list[str] | None = None) -> dict:
    from disan import Encoder  # onnxruntime: only the command loads a bundle

    p = argparse.ArgumentParser(prog="python -m research.lexical_channel",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, default=Path("models/default"))
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--idf-corpus", type=Path, required=True,
                   help="one text a line (a corpus's sentences.txt)")
    p.add_argument("--idf-every", type=int, default=5, help="read every Nth line of --idf-corpus")
    p.add_argument("--idf-texts", type=int, default=300_000)
    p.add_argument("--dims", type=int, nargs="+", default=[768], help="hash buckets")
    p.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.5])
    p.add_argument("--retrieval", type=Path, nargs="*", default=None,
                   help="BEIR-layout folders (default: DATA/retrieval/*)")
    p.add_argument("--transfer-weights", type=float, nargs="*", default=[],
                   help="also the transfer tasks (disan eval --transfer) at these weights, first --dims")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not args.idf_corpus.is_file():
        p.error(f"--idf-corpus {args.idf_corpus}: no such file")
    if min(args.dims) < 1 or args.idf_every < 1 or args.idf_texts < 1:
        p.error("--dims, --idf-every and --idf-texts: at least 1")
    if not all(0.0 <= w <= 1.0 for w in args.weights + args.transfer_weights):
        p.error("--weights and --transfer-weights: from 0 to 1")

    encoder = Encoder(args.bundle)
    vocab_size = len(encoder.runtime.tokenizer("embed"))

    def ids_of(texts: list[str]) -> list[list[int]]:
        return [list(item.ids) for item in encoder.prepare(texts).items]

    sample = sample_lines(args.idf_corpus, args.idf_every, args.idf_texts)
    df = np.zeros(vocab_size, np.int64)
    for start in range(0, len(sample), 20_000):
        df += document_frequency(ids_of(sample[start:start + 20_000]), vocab_size)
    idf = smoothed_idf(df, len(sample)).astype(np.float32)
    memo: dict[str, tuple[np.ndarray, list[int]]] = {}

    def remembered(texts: list[str]) -> None:  # each distinct text tokenized and embedded once
        missing = [t for t in dict.fromkeys(texts) if t not in memo]
        for start in range(0, len(missing), 10_000):
            part = missing[start:start + 10_000]
            prepared = encoder.prepare(part)
            ids = [list(item.ids) for item in prepared.items]
            memo.update(zip(part, zip(encoder.embed_prepared(prepared), ids, strict=True), strict=True))

    def mix_encoder(dims: int, weight: float):
        def encode(texts: list[str]) -> np.ndarray:
            remembered(texts)
            dense = np.stack([memo[t][0] for t in texts])
            if weight == 0.0:
                return unit_rows(dense)
            return mixed(dense, lexical_vectors([memo[t][1] for t in texts], idf, dims), weight)
        return encode

    folders = args.retrieval if args.retrieval is not None else sorted((args.data / "retrieval").glob("*/"))
    sets = [load_set(f) for f in folders]
    report: dict = {"idf_texts": len(sample), "vocab_size": vocab_size, "runs": {}}
    for dims in args.dims:
        for weight in args.weights:
            if weight == 0.0 and dims != args.dims[0]:
                continue
            encode = mix_encoder(dims, weight)
            row = {s.name: evaluate_set(s, encode)["ndcg@10"] for s in sets}
            row |= sts_scores(encode, args.data)
            label = f"dims {dims}, weight {weight}"
            report["runs"][label] = row
            print(label, " ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)
    if args.transfer_weights:
        from disan.eval.transfer import evaluate_encoder  # scikit-learn (`train`)

        senteval = args.data / "senteval" if (args.data / "senteval").is_dir() else args.data
        data_root = args.data if (args.data / "sst").is_dir() else None
        report["transfer"] = {}
        for weight in args.transfer_weights:
            label = f"dims {args.dims[0]}, weight {weight}"
            report["transfer"][label] = evaluate_encoder(mix_encoder(args.dims[0], weight), senteval,
                                                         data_root=data_root)
            print(label, json.dumps(report["transfer"][label]), flush=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.lexical_channel"))
