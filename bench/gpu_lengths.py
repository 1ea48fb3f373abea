"""bench/gpu.py --parts lengths: the offline encoder (`disan.Encoder`, as `disan embed` runs it)
at several batch budgets on short, medium and long texts.

The sweep picks the budget on SNLI sentences; a budget that suits 10-token sentences can cut
long texts' windows into many small calls, so each candidate is also timed on texts of a few
sentences and on documents that are windowed (`max_tokens` windows, pooled).
"""

from __future__ import annotations

import argparse
import time

from disan.runtime.batching import BatchLimits
from disan.runtime.encoder import Encoder

BUDGETS = [(1024, 1 << 16), (1024, 1 << 18), (256, 1 << 20), (1024, 1 << 22)]
SMOKE_BUDGETS = [(8, 256), (32, 4096)]


def text_sets(sentences: list[str], smoke: bool) -> dict[str, list[str]]:
    """short: the sentences; medium: 4 consecutive ones joined; long: 200 joined (windowed)."""
    join = 20 if smoke else 200
    return {"short (1 sentence)": sentences,
            "medium (4 sentences)": [" ".join(sentences[i:i + 4]) for i in range(0, len(sentences), 4)],
            f"long ({join} sentences, windowed)": [" ".join(sentences[i:i + join])
                                                  for i in range(0, len(sentences) - join + 1, join)]}


def lengths(args: argparse.Namespace, providers: str, sentences: list[str]) -> dict:
    """Texts/s and tokens/s (tokenizing excluded) per budget x text set; best of --repeats passes."""
    encoder = Encoder(args.bundle, providers=providers)
    # tokenized once: the budget changes only the calls (tokenizing is the same for every budget)
    prepared = {name: encoder.prepare(texts) for name, texts in text_sets(sentences, args.smoke).items()}
    tokens = {name: p.tokens for name, p in prepared.items()}
    rows = []
    for size, cells in SMOKE_BUDGETS if args.smoke else BUDGETS:
        encoder.limits = BatchLimits(size, cells)
        for name, texts in prepared.items():
            encoder.embed_prepared(texts)  # warm-up: this budget's shapes
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                encoder.embed_prepared(texts)
                best = min(best, time.perf_counter() - t0)
            rows.append({"budget": f"{size}/{cells}", "texts": name, "count": texts.texts,
                         "windows": len(texts.rows), "texts_per_s": round(texts.texts / best, 1),
                         "tokens_per_s": round(tokens[name] / best, 1)})
            print(f"lengths {size:>5}/{cells:<8} {name:>32}: {rows[-1]['texts_per_s']:10.1f} texts/s, "
                  f"{rows[-1]['tokens_per_s']:12.1f} tokens/s", flush=True)
    return {"encoder": repr(encoder), "tokens": tokens, "rows": rows}
