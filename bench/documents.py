"""Documents: `disan.Encoder.encode` (windows over the whole text) against all-MiniLM-L6-v2 (which
truncates at 256 word pieces) on the same abstracts, in one run, on the same threads.

    python -m bench.documents --bundle models/default [--bundle B2 ...] --data ../shared/data \\
        [--docs 400] [--rounds 3] [--threads 2] [--json bench/results/documents.json]

The texts are the first --docs documents of the staged SciFact corpus (title + " " + abstract,
about 300 words), as `disan eval --retrieval` embeds them. Each round times every engine once, one
after another (neighbours in time share the machine's load); a round's ratio is MiniLM's seconds
over the bundle's, and the report gives each round's ratios and their median. Tokenizing is
included for every engine, as a user calling `encode` pays it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from disan.eval.retrieval import load_set
from disan.runtime.encoder import Encoder


def timed(encode: Callable[[list[str]], object], texts: list[str]) -> float:
    start = time.perf_counter()
    encode(texts)
    return time.perf_counter() - start


def engines(bundles: list[Path], threads: int, minilm: bool) -> dict[str, Callable[[list[str]], object]]:
    out: dict[str, Callable[[list[str]], object]] = {}
    for bundle in bundles:
        enc = Encoder(bundle, variant="fp32", threads=threads, long_texts="window")
        out[f"DiSAN ({bundle})"] = lambda texts, enc=enc: enc.encode(texts, normalize=True)
    if minilm:
        import torch  # MiniLM's threads: torch is needed only for the MiniLM row

        from disan.train.word_vectors import _sentence_encoder  # sentence-transformers, offline

        torch.set_num_threads(threads)
        model = _sentence_encoder("minilm")
        out["all-MiniLM-L6-v2"] = lambda texts: model.encode(texts, batch_size=32, convert_to_numpy=True,
                                                             normalize_embeddings=True)
    return out


def run(bundles: list[Path], data: Path, docs: int, rounds: int, threads: int, minilm: bool = True) -> dict:
    texts = load_set(data / "retrieval" / "scifact").docs[:docs]
    encoders = engines(bundles, threads, minilm)
    for encode in encoders.values():
        encode(texts[:8])  # warm-up: sessions, tokenizers, first allocations
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(rounds):
        for name, encode in encoders.items():
            seconds[name].append(round(timed(encode, texts), 3))
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
              "threads": threads, "docs": len(texts), "words_mean": round(statistics.mean(len(t.split())
                                                                                         for t in texts), 1),
              "seconds": seconds}
    if minilm:
        base = seconds["all-MiniLM-L6-v2"]
        report["x_minilm"] = {}
        for name, secs in seconds.items():
            if name != "all-MiniLM-L6-v2":
                ratios = [b / s for b, s in zip(base, secs, strict=True)]
                report["x_minilm"][name] = {"rounds": [round(r, 2) for r in ratios],
                                            "median": round(statistics.median(ratios), 2)}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, action="append", required=True)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-minilm", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run(args.bundle, args.data, args.docs, args.rounds, args.threads, not args.no_minilm)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
