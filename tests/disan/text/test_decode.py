"""Token ids back to text (POST /decode): both tokenizers, the ids of `tokens`/`ids` round trip,
and an id that is no token is named."""

from __future__ import annotations

import pytest
from conftest import WORDS, tiny_piece_tokenizer

from disan.text.tokenizer import PAD, UNK, Vocab


def test_word_ids_decode_to_the_words_the_model_read() -> None:
    vocab = Vocab(WORDS)
    ids = vocab.ids(vocab.tokens("A man isn't playing the guitar!"))
    assert vocab.decode(ids) == "a man is n't playing the guitar !"
    assert vocab.decode([PAD, *ids[:2], UNK]) == "a man"
    assert vocab.decode([PAD, *ids[:2], UNK], skip_special_tokens=False) == "<pad> a man <unk>"
    with pytest.raises(ValueError, match=f"{len(vocab)} is no token id"):
        vocab.decode([ids[0], len(vocab)])


def test_piece_ids_decode_through_the_tokenizers_decoder() -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import decoders

    from disan.text.pieces import PieceTokenizer

    tok = tiny_piece_tokenizer()
    text = "a man is playing the guitar"
    ids = tok.batch_ids([text])[0]
    assert len(ids) > len(text.split())  # "guitar" is several pieces
    assert " ##" in tok.decode(ids)  # no decoder: the pieces as they are, spaced
    raw = tok._tok
    raw.decoder = decoders.WordPiece()
    joined = PieceTokenizer(raw)
    assert joined.decode(ids) == text
    assert joined.decode([0, *ids, 0]) == text  # padding has no text
    unk = joined.unk_id
    assert joined.decode([*ids[:1], unk]) == "a"
    assert joined.decode([*ids[:1], unk], skip_special_tokens=False) == "a [UNK]"
    for bad in (len(joined), 10**9):
        with pytest.raises(ValueError, match=f"{bad} is no token id"):
            joined.decode([ids[0], bad])
