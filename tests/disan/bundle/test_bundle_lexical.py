"""disan.bundle.lexical: the IDF levels a bundle stores and the sparse vectors made from them."""

from __future__ import annotations

import numpy as np
import pytest

from disan.bundle.lexical import LEXICAL_FILE, idf_levels, lexical_entry, load_idf, sparse_vector
from disan.bundle.manifest import BundleError


def test_idf_levels_round_the_smoothed_idf_and_give_unseen_ids_the_top_level():
    df = np.array([0, 1, 50, 100, 0])
    levels, scale = idf_levels(df, texts=100, bits=2)
    idf = np.log(101 / (df + 0.5))
    assert levels.dtype == np.uint8 and levels.max() == 3 and scale == pytest.approx(idf.max() / 3)
    assert levels[0] == levels[4] == 3  # never seen: the rarest there is
    assert levels[3] == 0  # in every text: weighs nothing
    np.testing.assert_array_less(np.abs(levels * scale - idf), scale / 2 + 1e-9)  # the nearest level
    with pytest.raises(ValueError, match="bits=9"):
        idf_levels(df, 100, bits=9)


def test_a_sparse_vector_weighs_each_distinct_id_by_idf_and_log_count_at_unit_length():
    idf = np.array([0.0, 1.0, 2.0, 4.0], dtype=np.float32)
    idx, val = sparse_vector([3, 1, 3, 0, 2], idf)
    assert idx.tolist() == [1, 2, 3]  # ascending; id 0 weighs nothing and is left out
    want = np.array([1.0, 2.0, 4.0 * (1 + np.log(2))])
    np.testing.assert_allclose(val, want / np.linalg.norm(want), rtol=1e-6)
    assert val.dtype == np.float32 and idx.dtype == np.int64
    empty = sparse_vector([], idf)
    assert len(empty[0]) == len(empty[1]) == 0
    assert len(sparse_vector([0, 0], idf)[0]) == 0  # only weightless ids: the empty vector


def write_table(folder, levels, listed: bool = True) -> dict:
    with open(folder / LEXICAL_FILE, "wb") as fh:
        np.savez_compressed(fh, levels=levels)
    return {"lexical": {"file": LEXICAL_FILE, "scale": 0.5},
            "files": {LEXICAL_FILE: "sha"} if listed else {}}


def test_load_idf_reads_levels_times_scale_and_refuses_what_does_not_fit(tmp_path):
    manifest = write_table(tmp_path, np.array([0, 1, 3], dtype=np.uint8))
    np.testing.assert_allclose(load_idf(tmp_path, manifest, 3), [0.0, 0.5, 1.5])
    assert load_idf(tmp_path, {}, 3) is None  # no table: no sparse vectors
    with pytest.raises(BundleError, match=r"need uint8 \[4\]"):
        load_idf(tmp_path, manifest, 4)
    with pytest.raises(BundleError, match="does not list"):
        load_idf(tmp_path, write_table(tmp_path, np.zeros(3, np.uint8), listed=False), 3)
    with pytest.raises(BundleError, match="naming its file and scale"):
        lexical_entry({"lexical": {"file": LEXICAL_FILE}})
    (tmp_path / LEXICAL_FILE).write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="not a lexical table"):
        load_idf(tmp_path, manifest, 3)


def test_sparse_dots_and_sparse_dot_are_the_dense_dot_products():
    from disan.bundle.lexical import sparse_dot, sparse_dots

    rng = np.random.default_rng(0)

    def vector():
        idx = np.sort(rng.choice(12, size=int(rng.integers(0, 5)), replace=False)).astype(np.int64)
        return idx, rng.random(len(idx)).astype(np.float32)

    a, b = [vector() for _ in range(4)], [vector() for _ in range(6)]
    dense = lambda vs: np.stack([np.bincount(i, v, minlength=12) for i, v in vs])  # noqa: E731
    want = dense(a) @ dense(b).T
    np.testing.assert_allclose(sparse_dots(a, b), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose([[sparse_dot(x, y) for y in b] for x in a], want, rtol=1e-6, atol=1e-7)
    assert sparse_dots([], b).shape == (0, 6)
