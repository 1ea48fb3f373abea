"""research.lexical_channel: the hashed bag of tokens and its mix with the dense vector."""

from __future__ import annotations

import math

import numpy as np
import pytest

from disan.bundle.lexical import document_frequency, smoothed_idf
from research.lexical_channel import hashing, lexical_vectors, mixed


def test_mixed_dot_products_are_the_weighted_mix_of_the_two_cosines():
    rng = np.random.default_rng(1)
    dense, lex = rng.normal(size=(2, 8)), rng.normal(size=(2, 5))
    lex /= np.linalg.norm(lex, axis=1, keepdims=True)
    unit = dense / np.linalg.norm(dense, axis=1, keepdims=True)
    for w in (0.0, 0.3, 1.0):
        m = mixed(dense, lex, w)
        assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-6)
        want = (1 - w) * unit[0] @ unit[1] + w * lex[0] @ lex[1]
        assert m[0] @ m[1] == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="from 0 to 1"):
        mixed(dense, lex, 1.5)


def test_rarer_ids_weigh_more_and_counts_saturate():
    df = document_frequency([[1, 2, 2], [1], [1, 3]], vocab_size=5)
    assert df.tolist() == [0, 3, 1, 1, 0]
    idf = smoothed_idf(df, texts=3).astype(np.float32)
    assert idf[1] < idf[2] == idf[3] < idf[0] and (idf > 0).all()
    vec = lexical_vectors([[1, 2, 2, 2]], idf, dims=16)[0]
    bucket, sign = hashing(5, 16)
    want = np.zeros(16, np.float32)
    want[bucket[1]] += sign[1] * idf[1]
    want[bucket[2]] += sign[2] * idf[2] * (1 + math.log(3))
    assert np.allclose(vec, want / np.linalg.norm(want), atol=1e-6)


def test_the_same_tokens_in_another_order_match_and_no_tokens_is_a_zero_row():
    idf = np.linspace(1.0, 3.0, 50).astype(np.float32)
    a, b, empty = lexical_vectors([[4, 9, 30], [30, 4, 9], []], idf, dims=32)
    assert a @ b == pytest.approx(1.0, abs=1e-6)
    assert not empty.any()
    again = lexical_vectors([[4, 9, 30]], idf, dims=32)[0]
    assert np.array_equal(a, again)  # the hashing is fixed: an index built today matches tomorrow


def test_bad_arguments_are_one_line_errors_before_any_bundle_loads(tmp_path, capsys):
    from research.lexical_channel import main

    corpus = tmp_path / "sentences.txt"
    corpus.write_text("a text\n", encoding="utf-8")
    for flags, message in ((["--idf-corpus", str(tmp_path / "none.txt")], "no such file"),
                           (["--idf-corpus", str(corpus), "--weights", "1.5"], "from 0 to 1"),
                           (["--idf-corpus", str(corpus), "--dims", "0"], "at least 1")):
        with pytest.raises(SystemExit) as exit_:
            main(["--bundle", str(tmp_path / "no-bundle"), "--data", str(tmp_path), "--out",
                  str(tmp_path / "r.json"), *flags])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
