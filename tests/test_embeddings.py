"""Word-vector files, vocabulary layout, trainable rows and matrix initialisation (no big files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from disan import embeddings as E  # noqa: E402
from disan.text import PAD, UNK, Vocab  # noqa: E402


def vec_line(word: str, values) -> str:
    return word + " " + " ".join(f"{v:.3f}" for v in values)


def test_glove_text_keeps_wanted_words_and_the_first_extras(tmp_path: Path) -> None:
    lines = [vec_line(w, [i, i + 0.5, -i]) for i, w in enumerate(["the", "The", "a", "dog", "cat", "zebra"])]
    lines.insert(3, vec_line("new york", [9, 9, 9]))  # glove.840B has a few words with spaces
    path = tmp_path / "glove.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    wv = E.load_text_vectors(path, wanted={"dog", "zebra"}, extra=2)
    assert wv.dim == 3
    assert wv.words == ["the", "a", "dog", "zebra"]  # "The" lowercases to a duplicate: first wins
    np.testing.assert_allclose(wv.vectors[wv.index["zebra"]], [5, 5.5, -5])


def test_word2vec_header_is_understood(tmp_path: Path) -> None:
    path = tmp_path / "w2v.txt"
    path.write_text("2 4\n" + vec_line("dog", [1, 2, 3, 4]) + "\n" + vec_line("cat", [4, 3, 2, 1]) + "\n")
    wv = E.load_text_vectors(path, wanted={"cat"}, extra=0)
    assert wv.words == ["cat"] and wv.dim == 4


def test_malformed_vector_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(vec_line("dog", [1, 2]) + "\ncat 1.0 oops\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: malformed number"):
        E.load_text_vectors(path, wanted={"cat"}, extra=0)
    with pytest.raises(ValueError, match="no such file"):
        E.load_text_vectors(tmp_path / "missing.txt", wanted=set(), extra=0)


def fake_vectors() -> E.WordVectors:
    words = ["the", "of", "dog", "king", "queen", "cat"]
    return E.WordVectors(words, np.arange(12, dtype=np.float32).reshape(6, 2) + 1, "fake")


def test_vocab_layout_training_words_then_more_texts_then_frozen_extras() -> None:
    train = [("the", "dog", "runs"), ("the", "cat")]
    vocab = E.build_vocab(train, fake_vectors(), extra=2, more_texts=[("zebra", "dog")])
    # frequency order (ties alphabetical), other datasets' words, then the first 2 new GloVe words
    assert vocab.itos == ["<pad>", "<unk>", "the", "cat", "dog", "runs", "zebra", "of", "king"]
    rows = E.trainable_rows(vocab, train)
    assert rows.tolist() == [False, True, True, True, True, True, False, False, False]


def test_init_matrix_copies_pretrained_rows_and_fills_the_rest() -> None:
    vocab = Vocab(["dog", "runs", "king"])
    wv = fake_vectors()
    matrix, found = E.init_matrix(vocab, wv, 2, seed=0)
    assert found == 2 and matrix.dtype == np.float32
    np.testing.assert_array_equal(matrix[vocab.stoi["king"]], wv.vectors[3])
    np.testing.assert_array_equal(matrix[PAD], [0, 0])
    for row in (UNK, vocab.stoi["runs"]):
        assert np.all(np.abs(matrix[row]) <= E.OOV_SCALE) and np.any(matrix[row] != 0)
    again, _ = E.init_matrix(vocab, wv, 2, seed=0)
    np.testing.assert_array_equal(matrix, again)


def test_vocab_hash_changes_with_the_words() -> None:
    assert E.vocab_hash(Vocab(["a", "b"])) == E.vocab_hash(Vocab(["a", "b"]))
    assert E.vocab_hash(Vocab(["a", "b"])) != E.vocab_hash(Vocab(["b", "a"]))
