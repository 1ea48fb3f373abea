"""disan.text.pieces.PieceTokenizer compares by what it reads: two tokenizers built from the same
tokenizer.json are equal, as two `Vocab`s with the same words are (a checkpoint scored through a
bundle's windows must read that bundle's tokenizer: disan.eval.encoders.checkpoint_windows)."""

from __future__ import annotations

import pytest
from conftest import WORDS, tiny_piece_tokenizer

from disan.text.tokenizer import Vocab


def test_tokenizers_from_the_same_json_are_equal_and_others_are_not() -> None:
    pytest.importorskip("tokenizers")
    from disan.text.pieces import PieceTokenizer  # needs `tokenizers`, skipped above without it

    tok = tiny_piece_tokenizer()
    assert PieceTokenizer.from_str(tok.to_str()) == tok
    raw = tok._tok
    raw.add_tokens(["zebra-crossing"])
    assert PieceTokenizer(raw) != tiny_piece_tokenizer()  # one more piece reads text otherwise
    assert tok != Vocab(WORDS)
    with pytest.raises(TypeError):
        hash(tok)  # equal by content: not a dict key
