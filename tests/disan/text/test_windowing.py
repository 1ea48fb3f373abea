"""disan.text.windowing: window cuts and token-weighted pooling (torch-free)."""

from __future__ import annotations

import numpy as np
import pytest

from disan.text.windowing import (
    LONG_TEXT_POLICIES,
    LongTextPolicy,
    pool_windows,
    split_windows,
    window_starts,
)


def test_a_fitting_text_is_one_window_of_itself() -> None:
    assert split_windows([5, 6, 7], 3) == [[5, 6, 7]]
    assert split_windows([5, 6], 8, overlap=2) == [[5, 6]]
    assert split_windows([], 4) == [[]]


def test_windows_cover_every_token_and_end_at_the_text_end() -> None:
    ids = list(range(10))
    assert split_windows(ids, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert split_windows(ids, 5) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert split_windows(ids, 4, overlap=2) == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1000])
@pytest.mark.parametrize(("size", "overlap"), [(8, 0), (8, 3), (64, 16), (1, 0)])
def test_window_invariants(n: int, size: int, overlap: int) -> None:
    ids = list(range(n))
    windows = split_windows(ids, size, overlap)
    assert all(1 <= len(w) <= size for w in windows) or n == 0
    assert sorted(set().union(*map(set, windows))) == ids
    assert windows[-1][-1:] == ids[-1:]
    assert len(windows) == len(window_starts(n, size, overlap))
    if n > size:  # every window full, so none is a noisy few-token tail
        assert all(len(w) == size for w in windows)


def test_bad_window_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        split_windows([1, 2], 0)
    with pytest.raises(ValueError, match="overlap"):
        split_windows([1, 2], 4, overlap=4)
    with pytest.raises(ValueError, match="overlap"):
        split_windows([1, 2], 4, overlap=-1)


def test_pool_is_the_token_weighted_mean() -> None:
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    pooled = pool_windows(vectors, [3, 1])
    # A plain mean would give [0.5, 0.5]; a sum [1, 1]; a normalised result unit length.
    np.testing.assert_allclose(pooled, [0.75, 0.25])
    assert pooled.dtype == np.float32


def test_pool_of_one_window_is_that_window_unnormalised() -> None:
    v = np.array([[3.0, 4.0]], dtype=np.float32)
    np.testing.assert_array_equal(pool_windows(v, [7]), [3.0, 4.0])


def test_pool_equals_the_mean_over_tokens() -> None:
    """Pooling windows equals averaging one vector per token (each token's window vector)."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4, 6)).astype(np.float32)
    lengths = [5, 2, 9, 1]
    per_token = np.repeat(vectors, lengths, axis=0)
    np.testing.assert_allclose(pool_windows(vectors, lengths), per_token.mean(axis=0), rtol=1e-5)


def test_pool_lead_weights_the_first_window() -> None:
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(pool_windows(vectors, [3, 3], lead=2.0), [2 / 3, 1 / 3])
    np.testing.assert_array_equal(pool_windows(vectors[:1], [3], lead=2.0), [1.0, 0.0])  # one window: itself
    with pytest.raises(ValueError, match="lead"):
        pool_windows(vectors, [3, 3], lead=0.0)


def test_pool_refuses_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="one length per window"):
        pool_windows(np.ones((2, 3)), [1])
    with pytest.raises(ValueError, match="positive"):
        pool_windows(np.ones((2, 3)), [1, 0])
    with pytest.raises(ValueError, match="windows, dim"):
        pool_windows(np.ones(3), [1])


def test_policy_values() -> None:
    assert LONG_TEXT_POLICIES == ("window", "truncate", "error")
    assert LongTextPolicy("window") is LongTextPolicy.WINDOW and LongTextPolicy.ERROR == "error"
