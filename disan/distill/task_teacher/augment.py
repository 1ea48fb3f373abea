"""New training sentences for a task teacher to label (TORCH-FREE): Tang et al. (2019),
"Distilling Task-Specific Knowledge from BERT into Simple Neural Networks", section 3.3.

A small student learns more from a teacher when the teacher labels more text than the gold
labels cover. Each variant of a training sentence is made word by word: with probability
`p_mask` the word becomes MASK, else with probability `p_swap` another word of the training
text, drawn by its frequency; then, with probability `p_ngram`, only an n-gram of the result is
kept (n uniform in 1..max_n). Tang et al. draw the replacement among words of the same part of
speech; no tagger is installed here, so any word of the training text may replace any other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

MASK = "<mask>"  # read by the teacher as its mask token, and by a DiSAN student as an unknown word


class Augmenter:
    """Variants of tokenized sentences; the replacement words come from `corpus`'s frequencies."""

    def __init__(self, corpus: Sequence[Sequence[str]], p_mask: float = 0.1, p_swap: float = 0.1,
                 p_ngram: float = 0.25, max_n: int = 5):
        for name, p in (("p_mask", p_mask), ("p_swap", p_swap), ("p_ngram", p_ngram)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} {p}: give a probability in [0, 1]")
        if p_mask + p_swap > 1.0:
            raise ValueError(f"p_mask + p_swap = {p_mask + p_swap}: give at most 1")
        if max_n < 1:
            raise ValueError(f"max_n {max_n}: give at least 1")
        counts = Counter(w for tokens in corpus for w in tokens)
        if not counts:
            raise ValueError("no words to draw replacements from")
        self.words = list(counts)
        freq = np.asarray([counts[w] for w in self.words], dtype=np.float64)
        self.cumulative = np.cumsum(freq / freq.sum())
        self.p_mask, self.p_swap, self.p_ngram, self.max_n = p_mask, p_swap, p_ngram, max_n

    def variant(self, tokens: Sequence[str], rng: np.random.Generator) -> tuple[str, ...]:
        draws = rng.random(len(tokens))
        swaps = np.searchsorted(self.cumulative, rng.random(len(tokens)), side="right")
        out = []
        for word, x, k in zip(tokens, draws, swaps, strict=True):
            if x < self.p_mask:
                out.append(MASK)
            elif x < self.p_mask + self.p_swap:
                out.append(self.words[min(int(k), len(self.words) - 1)])
            else:
                out.append(word)
        if out and rng.random() < self.p_ngram:
            n = min(int(rng.integers(1, self.max_n + 1)), len(out))
            start = int(rng.integers(0, len(out) - n + 1))
            out = out[start:start + n]
        return tuple(out)

    def augment(self, sentences: Sequence[Sequence[str]], per_sentence: int, seed: int,
                exclude: set[tuple[str, ...]] = frozenset()) -> list[tuple[str, ...]]:
        """Up to `per_sentence` distinct variants of each sentence, in sentence order; none is a
        sentence of `exclude` (the labelled training examples) or repeats another variant."""
        if per_sentence < 0:
            raise ValueError(f"per_sentence {per_sentence}: give 0 or more")
        rng = np.random.default_rng(seed)
        seen = set(exclude)
        out = []
        for tokens in sentences:
            for _ in range(per_sentence):
                v = self.variant(tokens, rng)
                if v and v not in seen:
                    seen.add(v)
                    out.append(v)
        return out
