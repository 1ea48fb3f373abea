"""Tokenizer and vocabulary (torch-free)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from disan.text.tokenizer import PAD, UNK, Vocab, _tokenize_general, tokenize

# (PTB-tokenized as in SST / tokenized SNLI, raw text a user would send)
PAIRS = [
    ("The Rock is destined to be the 21st Century 's new `` Conan '' .",
     'The Rock is destined to be the 21st Century\'s new "Conan".'),
    ("It does n't -LRB- really -RRB- work .", "It doesn't (really) work."),
    ("co-writer\\/director Peter Jackson 's vision", "co-writer/director Peter Jackson's vision"),
    ("I ca n't believe they 're here !", "I can't believe they're here!"),
    ("We can not wait ...", "We cannot wait..."),
    ("A man -LSB- sic -RSB- plays , sings and dances .", "A man [sic] plays, sings and dances."),
    ("She 'll say `` yes '' -- maybe .", "She\u2019ll say \u201cyes\u201d \u2014 maybe."),
]


@pytest.mark.parametrize(("ptb", "raw"), PAIRS)
def test_ptb_and_raw_text_give_the_same_tokens(ptb: str, raw: str) -> None:
    assert tokenize(ptb) == tokenize(raw)
    assert all(t == t.lower() for t in tokenize(raw))


def test_unknown_words_read_as_hashed_rows_of_the_rarest_words(tmp_path) -> None:
    words = [f"w{i}" for i in range(20)]
    plain, hashed = Vocab(words), Vocab(words, unknown_rows=4)
    tokens = ["w3", "guillemets", "929.06", "w3", "guillemets", "<unk>"]
    assert plain.ids(tokens) == [5, UNK, UNK, 5, UNK, UNK]
    ids = hashed.ids(tokens)
    assert ids[0] == ids[3] == 5 and ids[5] == UNK  # known words (and the UNK token) as before
    assert ids[1] == ids[4] and all(len(words) + 2 - 4 <= i < len(words) + 2 for i in ids[1:3])
    # the same id in every process and vocabulary copy: a stable hash of the spelling, not hash()
    assert Vocab(words, unknown_rows=4).ids(["guillemets"]) == [ids[1]]
    assert len({hashed.unknown_id(f"x{i}") for i in range(100)}) == 4  # every row is used
    assert hashed.ids(["\ud800"])[0] >= len(words) + 2 - 4  # a lone surrogate is hashed, not an error
    path = tmp_path / "vocab.json"
    hashed.save(path)
    assert json.loads(path.read_text(encoding="utf-8"))["unknown_rows"] == 4
    assert Vocab.load(path) == hashed and Vocab.load(path) != plain
    plain.save(path)
    assert "unknown_rows" not in json.loads(path.read_text(encoding="utf-8"))  # files as before
    with pytest.raises(ValueError, match="unknown_rows must be 0 to the 20 words"):
        Vocab(words, unknown_rows=21)


def test_tokenize_splits_clitics_and_punctuation() -> None:
    expected = ["do", "n't", "stop", ",", "it", "'s", "3.5", "miles", "!"]
    assert tokenize("Don't stop, it's 3.5 miles!") == expected
    assert tokenize("") == []


def test_vocab_json_round_trip(tmp_path) -> None:
    vocab = Vocab(["the", "movie", "é", "n't", "the"])  # duplicates are ignored
    assert vocab.itos[:2] == ["<pad>", "<unk>"] and len(vocab) == 6
    path = tmp_path / "vocab.json"
    vocab.save(path)
    again = Vocab.load(path)
    assert again == vocab and again.stoi == vocab.stoi
    assert json.loads(path.read_text(encoding="utf-8"))["format"] == "disan-vocab"
    # written compact: no space after the separators (the word list is most of its bytes)
    assert path.read_text(encoding="utf-8").startswith('{"format":"disan-vocab","version":1,')


def test_vocab_rejects_foreign_json() -> None:
    with pytest.raises(ValueError, match="not a disan vocab"):
        Vocab.from_json({"itos": ["a", "b"]})


def test_encode_pads_masks_and_maps_unknown_words() -> None:
    vocab = Vocab(["the", "movie", "is", "good"])
    enc = vocab.encode(["The movie is good", "unseen words", ""], max_len=3)
    assert enc.ids.dtype == np.int64 and enc.ids.shape == (3, 3)
    assert enc.ids[0].tolist() == [vocab.stoi["the"], vocab.stoi["movie"], vocab.stoi["is"]]
    assert enc.ids[1].tolist() == [UNK, UNK, PAD]
    assert enc.ids[2].tolist() == [UNK, PAD, PAD]  # empty text -> one UNK, never an empty row
    assert enc.mask.tolist() == [[True] * 3, [True, True, False], [True, False, False]]
    assert enc.lengths == [3, 2, 1]


# ---- the fast ASCII path must give exactly the tokens of the general path ----
# `_tokenize_general` runs every rewrite on any text (the tokenizer as it was before the ASCII
# fast path); the fast path must give exactly its tokens, checked here on random text.
# Pieces that exercise every rewrite: PTB escapes, clitics, negation, cannot, escapes, controls.
_PIECES = ["-LRB-", "-rrb-", "-LSB-", "-Rcb-", "``", "''", "`", "'", "'s", "'S", "'re", "'ll", "'d",
           "'m", "'ve", "n't", "N'T", "can", "not", "CanNot", "\\/", "\\*", "\\", "...", "--", "-",
           ".", ",", "/", "3.5", "a/b", "co-op", "_", "__", "x", "Man", "dogs", " ", "  ", "\t",
           "\n", "\x00", "\x7f", "\x1f", "é", "\u2019", "\u201c", "\u2014", "\u2026", "İ", "ſ",
           "\u212a", "ﬁ", "\u00a0", "\u200b", "①"]


def _check_same(text: str) -> None:
    assert tokenize(text) == _tokenize_general(text), repr(text)


def test_fast_path_matches_the_reference_on_known_cases() -> None:
    for ptb, raw in PAIRS:
        _check_same(ptb)
        _check_same(raw)
    for text in ["", " ", "a  b", " lead", "trail ", "x's's", "xn'tn't", "nn't", "cannot's",
                 "A man is playing a guitar on stage in front of a crowd .", "It's 'quoted'",
                 "\x00hidden\x1fcontrols\x7f", "under_score a_b", "''hello''", "``x``"]:
        _check_same(text)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # hypothesis is a dev extra: the known cases above still run
    given = None

if given is not None:
    @settings(max_examples=400, deadline=None)
    @given(st.text())
    def test_fast_path_matches_the_reference_on_random_unicode(text: str) -> None:
        _check_same(text)

    @settings(max_examples=400, deadline=None)
    @given(st.text(alphabet=st.characters(max_codepoint=127)))
    def test_fast_path_matches_the_reference_on_random_ascii(text: str) -> None:
        _check_same(text)

    @settings(max_examples=600, deadline=None)
    @given(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join))
    def test_fast_path_matches_the_reference_on_ptb_pieces(text: str) -> None:
        _check_same(text)


def test_an_unknown_compound_reads_as_its_known_words() -> None:
    vocab = Vocab(["dog", "man", "on", "in", "first", "past", "the", "post", "-", "well-known"])
    tokens = tokenize("A dog-man on/in the first-past-the-post, well-known x-ray -- -")
    assert vocab.pieces(tokens) == ["a", "dog", "-", "man", "on", "in", "the", "first", "-", "past", "-",
                                    "the", "-", "post", ",", "well-known", "x-ray", "--", "-"]
    assert vocab.tokens("the dog-man") == ["the", "dog", "-", "man"]
    # one id per piece: limits, windows and explanations count what the model reads
    assert vocab.text_ids("the dog-man") == vocab.ids(["the", "dog", "-", "man"])
    assert vocab.text_ids("the dog-man", max_len=2) == vocab.ids(["the", "dog"])
    assert vocab.token_ids(["the", "dog-man"], 3) == vocab.ids(["the", "dog", "-"])
    # a joint the vocabulary lacks ("/" here) is dropped; a compound with an unknown word stays whole
    assert vocab.ids(vocab.pieces(["x-ray"])) == [UNK]


def test_a_misspelt_word_reads_as_the_known_word_one_edit_away() -> None:
    vocab = Vocab(["the", "ingredients", "escalator", "referring", "greenwich", "hotel", "hostel",
                   "cooking", "blade", "blades"])
    text = "The ingrediants escelator refering greenwhich cookign"
    assert vocab.tokens(text) == ["the", "ingredients", "escalator", "referring", "greenwich", "cooking"]
    assert vocab.text_ids(text)[1] == vocab.stoi["ingredients"]
    # several known words one edit away: the earliest in the vocabulary (the more frequent)
    assert vocab.spelled("hootel") == "hotel" and vocab.spelled("hxstel") == "hostel"
    assert vocab.spelled("bladez") == "blade"  # "blade" (replace) and "blades" (insert) both qualify
    # left unknown: no word one edit away, too short, too long, not a-z, or two edits away
    for word in ["zzzzzz", "thee", "ingredientsingredientsxx", "ingrédients", "escal4tor", "ingrdiants"]:
        assert vocab.spelled(word) is None
        assert vocab.token_ids([word]) == [UNK]


def test_spelling_matches_every_edit_of_the_brute_force() -> None:
    """The index (`_OneEdit`) finds exactly the known words among all strings one edit away."""
    import random
    import string

    rng = random.Random(0)
    words = sorted({"".join(rng.choice("abcde") for _ in range(rng.randrange(4, 9))) for _ in range(400)})
    vocab = Vocab(words)

    def brute(q: str) -> str | None:
        splits = [(q[:i], q[i:]) for i in range(len(q) + 1)]
        near = ({a + b[1:] for a, b in splits if b}
                | {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
                | {a + c + b[1:] for a, b in splits if b for c in string.ascii_lowercase}
                | {a + c + b for a, b in splits for c in string.ascii_lowercase})
        ids = [vocab.stoi[w] for w in near if w in vocab.stoi]
        return vocab.itos[min(ids)] if ids else None

    queries = {"".join(rng.choice("abcdef") for _ in range(rng.randrange(5, 9))) for _ in range(600)}
    queries = [q for q in queries if q not in vocab]
    assert sum(brute(q) is not None for q in queries) > 50  # the test sees many corrections
    for q in queries:
        assert vocab.spelled(q) == brute(q), q


def test_spelling_index_builds_without_a_list_per_key() -> None:
    """The index is built while a bundle loads, so its peak can be the process's peak resident
    set: a Python list of hashes on the way costs several times the arrays kept, which are 13
    bytes a key (hash, id, letter)."""
    import random
    import string
    import tracemalloc

    from disan.text.tokenizer import _OneEdit

    rng = random.Random(0)
    vocab = Vocab(sorted({"".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 12)))
                          for _ in range(20000)}))
    tracemalloc.start()
    try:
        index = _OneEdit(vocab.itos, vocab.stoi)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    keys = len(index.keys)
    assert keys > 100_000
    assert kept / keys < 16
    assert peak / keys < 48


def test_spelling_answers_stay_bounded(monkeypatch) -> None:
    import disan.text.tokenizer as text_module

    monkeypatch.setattr(text_module, "_SPELLING_CACHE", 3)
    vocab = Vocab(["hotel", "hostel"])
    for q in ["hootel", "hxstel", "aaaaaa", "bbbbbb", "hootel"]:
        vocab.spelled(q)
        assert len(vocab._spelled) <= 3
    assert vocab.spelled("hootel") == "hotel"


def test_a_pickled_vocab_rebuilds_its_spelling_index() -> None:
    """The index holds this process's string hashes; a copy sent elsewhere must not carry it."""
    import pickle

    vocab = Vocab(["the", "ingredients"])
    assert vocab.spelled("ingrediants") == "ingredients" and vocab._one_edit is not None
    copy = pickle.loads(pickle.dumps(vocab))
    assert copy._one_edit is None and copy._spelled == {}
    assert copy.spelled("ingrediants") == "ingredients" and copy.stoi == vocab.stoi


def test_a_negation_without_its_apostrophe_reads_as_with_it() -> None:
    """"wasnt" is one edit from "want": read as `was n't`, as "wasn't" is, the negation kept."""
    vocab = Vocab(["i", "was", "did", "want", "n't", "know", "dont", "couldst", "could"])
    assert vocab.tokens("I wasnt, I didnt know") == vocab.tokens("I wasn't, I didn't know") == [
        "i", "was", "n't", ",", "i", "did", "n't", "know"]
    assert vocab.tokens("couldnt") == ["could", "n't"]  # not the spelling guess "couldst"
    assert vocab.tokens("dont") == ["dont"]  # a known word stays itself
    assert vocab.tokens("mightnt") == ["mightnt"]  # "might" unknown here: left to the rest
