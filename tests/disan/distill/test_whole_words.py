"""`disan distill whole-words`: a piece encoder reads the words of a word encoder's table whole
(at id offset + row, through a fitted map) and every other string as the pieces it read before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, make_tiny_checkpoint, tiny_piece_tokenizer

from disan.text.tokenizer import Vocab

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from disan.cli import main  # noqa: E402
from disan.distill.whole_words import whole_words  # noqa: E402
from disan.text.pieces import PieceTokenizer  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint, write_checkpoint  # noqa: E402

torch.set_num_threads(1)

DIM = 12
LENT = ["violin", "piano", "Sunset", "u.n."]  # words only the word encoder knows (two never read whole)


@pytest.fixture(scope="module")
def lender(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("lender") / "words.pt", "encoder",
                                Vocab([*LENT, *WORDS]), [], seed=5, proj_dim=16, embed_dim=DIM)


@pytest.fixture(scope="module")
def student(tmp_path_factory, lender) -> Path:
    """A piece student grafted from the lender: its whole-word pieces hold the lender's rows."""
    tok = tiny_piece_tokenizer()
    path = tmp_path_factory.mktemp("student") / "student.pt"
    make_tiny_checkpoint(path, "encoder", Vocab([f"w{i}" for i in range(len(tok) - 2)]), [], seed=7,
                         proj_dim=16, embed_dim=DIM)
    payload, words = load_checkpoint(path), load_checkpoint(lender)
    table = payload["model_state"]["embed.weight"]
    for row, word in enumerate(words["vocab"]):
        if row > 1 and word in tok:
            table[tok.ids([word])[0]] = words["model_state"]["embed.weight"][row]
    payload.update(vocab=[], tokenizer=tok.to_str())
    write_checkpoint(path, payload)
    return path


@pytest.fixture(scope="module")
def piece_ckpt_rows(tmp_path_factory, student) -> Path:
    """The student with other (random) rows for its whole-word pieces."""
    payload = load_checkpoint(student)
    table = payload["model_state"]["embed.weight"]
    table.copy_(torch.randn(table.shape, generator=torch.Generator().manual_seed(3)))
    path = tmp_path_factory.mktemp("rows") / "student.pt"
    write_checkpoint(path, payload)
    return path


def vectors(payload: dict, texts: list[str]) -> tuple[np.ndarray, list[list[int]]]:
    model, _, _ = model_from_checkpoint(payload)
    tok = PieceTokenizer.from_str(payload["tokenizer"])
    enc = tok.encode(texts)
    with torch.no_grad():
        return model(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)).numpy(), tok.batch_ids(texts)


def test_a_word_of_the_table_reads_whole_as_its_row(student, lender) -> None:
    before, words = load_checkpoint(student), load_checkpoint(lender)
    after, report = whole_words(before, words)
    own = after["config"]["vocab_size"]
    tok = PieceTokenizer.from_str(after["tokenizer"])
    row = words["vocab"].index("violin")
    assert len(PieceTokenizer.from_str(before["tokenizer"]).tokens("violin")) > 1
    assert tok.tokens("violin") == ["violin"] and tok.batch_ids(["violin"]) == [[own + row]]
    assert report["fit_heldout_cosine"] == 1.0  # a graft: the map is the identity
    model, _, _ = model_from_checkpoint(after)
    with torch.no_grad():
        got = model.word_vectors(torch.tensor([[own + row]]))[0, 0]
    torch.testing.assert_close(got, words["model_state"]["embed.weight"][row], rtol=0, atol=1e-4)
    # the text reads the lender's row where the pieces were: the vector changes
    assert not np.allclose(vectors(before, ["a man playing the violin"])[0],
                           vectors(after, ["a man playing the violin"])[0], atol=1e-4)


def test_text_the_table_lacks_reads_as_the_same_pieces(student, lender) -> None:
    """Words the student reads as one piece, and a word the table lacks, read exactly as before;
    a word the normalizer changes ("Sunset") or the pre-tokenizer splits ("u.n.") is never added."""
    before = load_checkpoint(student)
    after, report = whole_words(before, load_checkpoint(lender))
    pieces = PieceTokenizer.from_str(before["tokenizer"])
    texts = [" ".join(w for w in WORDS if w in pieces), "phytosterol", "sunset"]
    np.testing.assert_allclose(vectors(after, texts)[0], vectors(before, texts)[0], atol=1e-5)
    tok = PieceTokenizer.from_str(after["tokenizer"])
    assert [tok.tokens(t) for t in texts] == [pieces.tokens(t) for t in texts]
    assert "sunset" not in tok and "u.n." not in tok
    assert report["whole_words"] == sum(1 for w in ["violin", "piano", *WORDS] if w not in pieces)


def test_the_tokenizer_counts_ids_past_unused_ones(student, lender) -> None:
    """The unused ids (rows never read whole) still count: len() is one past the highest model id."""
    words = load_checkpoint(lender)
    after, _ = whole_words(load_checkpoint(student), words)
    tok = PieceTokenizer.from_str(after["tokenizer"])
    last = max(r for r, w in enumerate(words["vocab"]) if w in tok and w not in tiny_piece_tokenizer())
    assert len(tok) == after["config"]["vocab_size"] + last + 1
    assert tok.pieces_by_id()[len(tok) - 1] == words["vocab"][last]


def test_max_words_reads_only_the_first_rows_whole(student, lender, tmp_path) -> None:
    out = tmp_path / "w.pt"
    assert main(["distill", "whole-words", str(student), str(lender), str(out), "--max-words", "3"]) == 0
    payload = load_checkpoint(out)
    tok = PieceTokenizer.from_str(payload["tokenizer"])
    assert tok.tokens("violin") == ["violin"] and tok.tokens("piano") != ["piano"]  # rows 2 and 3
    assert payload["whole_words"]["whole_words"] == 1
    assert payload["whole_words"]["lender"]["file"] == "words.pt"
    assert payload["config"]["borrowed_offset"] == payload["config"]["vocab_size"]


def test_pieces_that_hold_their_words_rows_are_read_from_the_table(student, lender, piece_ckpt_rows) -> None:
    """A graft's whole-word pieces hold the word rows: they move to the word table (the own table
    keeps the other pieces and the special tokens) and read the same vectors. A student whose rows
    differ from the words' keeps every piece."""
    before, words = load_checkpoint(student), load_checkpoint(lender)
    after, report = whole_words(before, words)
    pieces = PieceTokenizer.from_str(before["tokenizer"])
    tok = PieceTokenizer.from_str(after["tokenizer"])
    moved = [w for w in words["vocab"][2:] if w in pieces]
    assert moved and report["pieces_read_from_the_table"] == len(moved)
    assert after["config"]["vocab_size"] == before["config"]["vocab_size"] - len(moved)
    own = after["config"]["vocab_size"]
    assert all(tok.ids([w])[0] == own + words["vocab"].index(w) for w in moved)
    assert tok.tokens("[UNK]") == ["[UNK]"] and tok.ids(["[UNK]"])[0] < own  # special: stays its own
    other, report = whole_words(load_checkpoint(piece_ckpt_rows), words)
    assert report["pieces_read_from_the_table"] == 0
    assert other["config"]["vocab_size"] == len(pieces)


def test_what_it_refuses(student, lender, tmp_path, capsys) -> None:
    words, piece = load_checkpoint(lender), load_checkpoint(student)
    with pytest.raises(ValueError, match="piece encoder"):
        whole_words(words, words)
    with pytest.raises(ValueError, match="word encoder"):
        whole_words(piece, piece)
    twice, _ = whole_words(piece, words)
    with pytest.raises(ValueError, match="already"):
        whole_words(twice, words)
    assert main(["distill", "whole-words", str(student), str(lender), str(tmp_path / "x.pt"),
                 "--max-words", "0"]) != 0
    assert "--max-words must be >= 1" in capsys.readouterr().err and not (tmp_path / "x.pt").exists()


def test_a_word_that_carries_the_unk_row_is_not_read_whole(student, lender) -> None:
    """A bundle word the word encoder lacks holds its UNK row in the borrowed table: reading it
    whole would read UNK, so it stays pieces."""
    words = load_checkpoint(lender)
    table = words["model_state"]["embed.weight"]
    table[words["vocab"].index("piano")] = table[1]
    tok = PieceTokenizer.from_str(whole_words(load_checkpoint(student), words)[0]["tokenizer"])
    assert tok.tokens("violin") == ["violin"] and tok.tokens("piano") != ["piano"]


def test_clitics_split_as_the_word_table_split_them(student, lender) -> None:
    """The table's "n't" and "'s" read whole: text splits as the word tokenizer split it ("does n't",
    not BERT's "doesn ' t"), curly apostrophes too; other symbols still split as BERT splits them."""
    words = load_checkpoint(lender)
    tok = PieceTokenizer.from_str(whole_words(load_checkpoint(student), words)[0]["tokenizer"])
    assert tok.words("It doesn't, he\u2019s") == ["it", "does", "n't", ",", "he", "'s"]
    assert tok.words("o'neill a_b 3.5 co-writer") == [
        "o", "'", "neill", "a", "_", "b", "3", ".", "5", "co", "-", "writer"]
    after = whole_words(load_checkpoint(student), words)[0]
    assert tok.batch_ids(["n't"]) == [[after["config"]["vocab_size"] + words["vocab"].index("n't")]]
