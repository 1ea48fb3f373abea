"""research.transfer_paired: item by item, the scores `disan eval --transfer` gives, and the paired
test on the items only one encoder gets right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from support_files import SENTEVAL_WORDS, write_senteval_tree  # noqa: E402

from disan.eval.transfer import evaluate_encoder  # noqa: E402
from research.transfer_paired import compare, item_scores, mcnemar  # noqa: E402


def bag_of_words(texts: list[str]) -> np.ndarray:
    return np.array([[t.split().count(w) for w in SENTEVAL_WORDS] for t in texts], dtype=np.float32)


def noisy(texts: list[str]) -> np.ndarray:
    """The bag of words under noise that depends on the text alone: worse, and a different vector per
    text whatever the batch."""
    width = len(SENTEVAL_WORDS)
    noise = np.stack([np.random.default_rng(sum(map(ord, t))).normal(size=width) for t in texts])
    return bag_of_words(texts) + 1.5 * noise.astype(np.float32)


def test_the_items_give_the_scores_disan_eval_gives(tmp_path: Path) -> None:
    senteval = write_senteval_tree(tmp_path)
    items = item_scores(noisy, senteval, seeds=[1, 2])
    scores = evaluate_encoder(noisy, senteval)  # seed 1; 60 texts in 10 folds of 6: the same mean
    for task in ("MR", "CR", "SUBJ", "MPQA"):
        assert set(items[task]["right"]) == {1, 2} and len(items[task]["right"][1]) == 60
        assert 100 * items[task]["right"][1].mean() == pytest.approx(scores[task], abs=0.01)
    assert 100 * items["TREC"]["right"].mean() == pytest.approx(scores["TREC"], abs=0.01)
    assert 100 * items["SICK-E"]["right"].mean() == pytest.approx(scores["SICK-E"], abs=0.01)
    assert len(items["TREC"]["right"]) == 30 and len(items["SICK-E"]["right"]) == 30


def test_mcnemar_counts_the_items_only_one_gets_right() -> None:
    same = mcnemar(np.array([True, True, False, False]), np.array([True, True, False, False]))
    assert same == {"reference": 50.0, "candidate": 50.0, "only_reference": 0, "only_candidate": 0, "p": 1.0}
    lost = mcnemar(np.ones(20, bool), np.r_[np.zeros(10, bool), np.ones(10, bool)])
    assert lost["only_reference"] == 10 and lost["only_candidate"] == 0
    assert lost["p"] == pytest.approx(2 * 0.5 ** 10, abs=1e-4)  # exact two-sided binomial on 10 items
    even = mcnemar(np.array([True, False, True, False]), np.array([False, True, False, True]))
    assert even["p"] == 1.0 and even["reference"] == even["candidate"] == 50.0


def test_compare_reads_the_seeds_and_the_fixed_splits(tmp_path: Path) -> None:
    senteval = write_senteval_tree(tmp_path)
    clean, worse = (item_scores(e, senteval, seeds=[1, 2]) for e in (bag_of_words, noisy))
    itself = compare(clean, clean)
    assert itself["TREC"]["p"] == 1.0 and itself["MR"]["difference_mean"] == 0.0
    report = compare(clean, worse)
    assert set(report["MR"]["seeds"]) == {"1", "2"}
    assert report["MR"]["candidate_mean"] < report["MR"]["reference_mean"]
    assert report["MR"]["difference_mean"] < 0 and report["MR"]["difference_range"][1] <= 0
    assert report["TREC"]["only_reference"] >= report["TREC"]["only_candidate"]
