"""disan.distill.task_teacher.augment: Tang et al.'s variants of training sentences (masked words,
swapped words, n-grams)."""

from __future__ import annotations

import numpy as np
import pytest

from disan.distill.task_teacher.augment import MASK, Augmenter

SENTENCES = [tuple("the film is a charming and moving story".split()),
             tuple("a dull , plodding mess".split()), tuple("not bad at all".split())]


def test_each_rule_alone_does_what_it_says() -> None:
    rng = np.random.default_rng(0)
    masked = Augmenter(SENTENCES, p_mask=1.0, p_swap=0.0, p_ngram=0.0).variant(SENTENCES[0], rng)
    assert masked == (MASK,) * len(SENTENCES[0])
    words = {w for s in SENTENCES for w in s}
    swapped = [Augmenter(SENTENCES, p_mask=0.0, p_swap=1.0, p_ngram=0.0).variant(SENTENCES[0], rng)
               for _ in range(50)]
    assert all(len(v) == len(SENTENCES[0]) and set(v) <= words for v in swapped)
    assert len({w for v in swapped for w in v}) > len(words) // 2  # drawn from the whole text
    grams = [Augmenter(SENTENCES, p_mask=0.0, p_swap=0.0, p_ngram=1.0, max_n=3).variant(SENTENCES[0], rng)
             for _ in range(50)]
    text = " " + " ".join(SENTENCES[0]) + " "
    assert all(1 <= len(g) <= 3 and f" {' '.join(g)} " in text for g in grams)  # contiguous pieces
    kept = Augmenter(SENTENCES, p_mask=0.0, p_swap=0.0, p_ngram=0.0).variant(SENTENCES[1], rng)
    assert kept == SENTENCES[1]


def test_swaps_follow_the_words_frequencies() -> None:
    corpus = [("common",)] * 99 + [("rare",)]
    rng = np.random.default_rng(1)
    aug = Augmenter(corpus, p_mask=0.0, p_swap=1.0, p_ngram=0.0)
    drawn = [aug.variant(("x",), rng)[0] for _ in range(2000)]
    assert 0.95 < drawn.count("common") / len(drawn) < 1.0


def test_augment_is_repeatable_distinct_and_leaves_out_the_excluded() -> None:
    aug = Augmenter(SENTENCES)
    first = aug.augment(SENTENCES, 20, seed=3, exclude=set(SENTENCES))
    assert first == aug.augment(SENTENCES, 20, seed=3, exclude=set(SENTENCES))
    assert first != aug.augment(SENTENCES, 20, seed=4, exclude=set(SENTENCES))
    assert len(first) == len(set(first)) and not set(first) & set(SENTENCES)
    assert 0 < len(first) <= 60 and all(first)
    assert aug.augment(SENTENCES, 0, seed=3) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"p_mask": 1.5}, "p_mask 1.5"), ({"p_ngram": -0.1}, "p_ngram -0.1"),
    ({"p_mask": 0.6, "p_swap": 0.6}, "p_mask + p_swap"), ({"max_n": 0}, "max_n 0"),
])
def test_bad_settings_are_errors(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        Augmenter(SENTENCES, **kwargs)
    with pytest.raises(ValueError, match="no words"):
        Augmenter([()])
