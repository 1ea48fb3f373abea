"""disan extend-vocab: new words get the trained table's linear map of their static vectors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import make_tiny_checkpoint  # noqa: E402

from disan.cli import main  # noqa: E402
from disan.distill import vocab_extend  # noqa: E402
from disan.distill.loop import checkpoint_encoder  # noqa: E402
from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.text.tokenizer import UNK, Vocab  # noqa: E402
from disan.train import word_vectors as E  # noqa: E402
from disan.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

KNOWN = [f"w{i}" for i in range(60)] + ["lost"]  # "lost" will carry the UNK row
DIM = 16
MAP = np.random.default_rng(1).standard_normal((DIM, DIM))
BIAS = np.random.default_rng(2).standard_normal(DIM)


def static(word: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(DIM)


def fake_static_vectors(vocab: Vocab, dim: int, source: str) -> E.WordVectors:
    assert dim == DIM and source == "minilm"
    return E.WordVectors(vocab.itos[2:], np.stack([static(w) for w in vocab.itos[2:]]), source)


@pytest.fixture
def student(tmp_path: Path, monkeypatch) -> Path:
    """An encoder whose known rows are exactly MAP of their static vectors plus BIAS."""
    monkeypatch.setattr(E, "static_vectors", fake_static_vectors)
    path = make_tiny_checkpoint(tmp_path / "student.pt", "encoder", Vocab(KNOWN), [], seed=0)
    payload = load_checkpoint(path)
    table = payload["model_state"]["embed.weight"].numpy().copy()
    for i, word in enumerate(KNOWN, start=2):
        table[i] = static(word) @ MAP + BIAS
    table[KNOWN.index("lost") + 2] = table[UNK]
    encoder = DiSANEncoder(DiSANConfig.from_dict(payload["config"]))
    encoder.load_state_dict(payload["model_state"] | {"embed.weight": torch.from_numpy(table)})
    save_checkpoint(path, encoder, Vocab(KNOWN), [], train_config={"init": "minilm"},
                    optimizer_state={"stale": 1})
    return path


def test_new_words_get_the_fitted_map_and_old_texts_are_unchanged(student: Path) -> None:
    payload = load_checkpoint(student)
    extended, report = vocab_extend.extend_vocab(payload, ["w3", "new1", "lost", "new2", "new1"], "minilm")
    words, table = extended["vocab"], extended["model_state"]["embed.weight"].numpy()
    assert words[: len(KNOWN) + 2] == payload["vocab"] and words[len(KNOWN) + 2:] == ["new1", "new2"]
    assert report["added"] == 2 and report["unk_rows_filled"] == 1 and report["fit_words"] == 60
    assert report["fit_heldout_cosine"] > 0.9999  # the rows are an exact linear map of static vectors
    for word in ("new1", "new2", "lost"):
        np.testing.assert_allclose(table[words.index(word)], static(word) @ MAP + BIAS, rtol=1e-4, atol=1e-4)
    old = payload["model_state"]["embed.weight"].numpy()
    np.testing.assert_array_equal(table[: len(old)][[i for i in range(len(old)) if i != words.index("lost")]],
                                  np.delete(old, words.index("lost"), axis=0))
    assert extended["config"]["vocab_size"] == len(words) == table.shape[0]
    assert not extended["model_state"]["trainable_rows"][-2:].any()


def test_cli_writes_a_checkpoint_every_reader_takes(student: Path, tmp_path: Path, monkeypatch,
                                                    capsys) -> None:
    glove = E.WordVectors(["w1", "new1", "new2", "new3"], np.zeros((4, 2)), "fake glove")
    monkeypatch.setattr(E, "load_glove_package", lambda: glove)
    out = tmp_path / "extended.pt"
    assert main(["distill", "extend-vocab", str(student), str(out), "--top", "3"]) == 0
    assert "2 words added" in capsys.readouterr().out
    payload = load_checkpoint(out)
    assert payload["vocab"][-2:] == ["new1", "new2"] and "optimizer_state" not in payload
    assert payload["vocab_extension"]["list"] == "GloVe 6B, first 3 words"
    assert payload["vocab_extension"]["from"]["file"] == "student.pt" and "recovered_from" not in payload
    from disan.train.checkpoint import provenance  # what a bundle's manifest says of it

    assert provenance(out, payload)["vocab_extension"]["added"] == 2
    before, after = checkpoint_encoder(student), checkpoint_encoder(out)
    np.testing.assert_array_equal(before(["w1 w2 w3"]), after(["w1 w2 w3"]))  # no new word: as before
    assert not np.allclose(before(["w1 new1"]), after(["w1 new1"]))  # was UNK, now its own row


def test_refusals_are_one_line(student: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(E, "load_glove_package", lambda: E.WordVectors(["w1"], np.zeros((1, 2)), "g"))
    assert main(["distill", "extend-vocab", str(student), str(tmp_path / "x.pt")]) == 2
    assert "no word to add" in capsys.readouterr().err
    nli = make_tiny_checkpoint(tmp_path / "nli.pt", "nli", Vocab(KNOWN), ["a", "b", "c"], seed=0)
    assert main(["distill", "extend-vocab", str(nli), str(tmp_path / "x.pt"), "--source", "minilm"]) == 2
    assert "sentence encoder checkpoint" in capsys.readouterr().err
    bare = make_tiny_checkpoint(tmp_path / "bare.pt", "encoder", Vocab(KNOWN), [], seed=0)
    assert main(["distill", "extend-vocab", str(bare), str(tmp_path / "x.pt")]) == 2
    assert "name one with --source" in capsys.readouterr().err
    assert main(["distill", "extend-vocab", str(student), str(tmp_path / "x.pt"), "--top", "0"]) == 2


def test_unknown_rows_make_a_shared_unknown_word_a_shared_row(student: Path, tmp_path: Path, monkeypatch,
                                                              capsys) -> None:
    glove = E.WordVectors(["w1", "new1", "new2", "new3"], np.zeros((4, 2)), "fake glove")
    monkeypatch.setattr(E, "load_glove_package", lambda: glove)
    out = tmp_path / "extended.pt"
    assert main(["distill", "extend-vocab", str(student), str(out), "--top", "4", "--unknown-rows", "2"]) == 0
    assert "the last 2 words" in capsys.readouterr().out
    payload = load_checkpoint(out)
    assert payload["unknown_rows"] == 2 and payload["vocab_extension"]["unknown_rows"] == 2
    from disan.train.checkpoint import checkpoint_vocab

    vocab = checkpoint_vocab(payload)
    assert vocab.ids(["zebra"])[0] in (len(vocab) - 2, len(vocab) - 1)  # new2 or new3's row
    before, after = checkpoint_encoder(student), checkpoint_encoder(out)
    np.testing.assert_array_equal(before(["w1 w2 w3"]), after(["w1 w2 w3"]))  # known words: as before
    unknown = after(["w1 zebra", "w1 " + vocab.itos[vocab.ids(["zebra"])[0]]])
    np.testing.assert_allclose(unknown[0], unknown[1], rtol=1e-6)  # zebra reads as that word's row
    assert not np.allclose(unknown[0], before(["w1 zebra"])[0])  # not as UNK any more
    assert main(["distill", "extend-vocab", str(student), str(tmp_path / "x.pt"), "--top", "4",
                 "--unknown-rows", "99"]) == 2
    assert "unknown_rows must be 0 to the" in capsys.readouterr().err
