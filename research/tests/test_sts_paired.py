"""research.sts_paired: the scores `disan eval --sts` gives (subsets averaged), and the paired
bootstrap on the same pairs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from research.sts_paired import paired_bootstrap, spearman


def test_spearman_is_scipys_row_by_row() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 30)), rng.normal(size=(4, 30))
    x[0, :5] = 0.0  # ties
    want = [spearmanr(a, b).statistic for a, b in zip(x, y, strict=True)]
    np.testing.assert_allclose(spearman(x, y), want)


def test_the_bootstrap_reads_the_same_pairs_for_both() -> None:
    rng = np.random.default_rng(1)
    gold = rng.uniform(0, 5, 400)
    groups = np.repeat([0, 1], 200)
    noisy = gold + rng.normal(scale=3.0, size=400)
    same = paired_bootstrap(gold, noisy, noisy, groups, rounds=200)
    assert same["difference"] == 0.0 and same["interval"] == [0.0, 0.0] and same["p"] == 1.0
    better = paired_bootstrap(gold, noisy, gold + rng.normal(scale=0.5, size=400), groups, rounds=200)
    assert better["difference"] > 0.2 and better["interval"][0] > 0 and better["p"] < 0.01
    each = [spearmanr(noisy[groups == g], gold[groups == g]).statistic for g in (0, 1)]
    assert better["reference"] == pytest.approx(np.mean(each), abs=1e-4)  # subsets averaged, as SemEval does
    worse = paired_bootstrap(gold, noisy, gold + rng.normal(scale=30.0, size=400), groups, rounds=200)
    assert worse["difference"] < 0 and worse["interval"][1] < 0
