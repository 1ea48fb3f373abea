"""Subword pieces (TORCH-FREE): the tokenizer a piece-reading model carries as `tokenizer.json`.

A `PieceTokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (Rust; what text-embeddings-inference
uses) loaded from a `tokenizer.json`: by default the teacher's own WordPiece vocabulary
(all-mpnet-base-v2's 30,527 pieces), so every string maps to known pieces. DiSAN reads the pieces
alone: no [CLS]/[SEP] are added, and nothing is truncated here (windows are the runtime's business).
Padding is id 0 in the model's input, so piece ids are shifted by one: model id = piece id + 1.

It answers the word `Vocab`'s reading methods (`tokens`, `ids`, `token_ids`, `text_ids`,
`encode`, `pad`, `in`), so the runtime, the service's /tokenize and the long-text preparation
take either: a bundle's manifest names the tokenizer of each graph (disan.bundle.manifest).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from disan.optional import require
from disan.text.tokenizer import Encoded, Vocab, pad_rows

PAD = 0
SHIFT = 1  # model id = piece id + SHIFT, so that 0 is padding


class PieceTokenizer:
    spelling = False  # a word vocabulary's spelling fallback: pieces need none (every string reads)

    def __init__(self, tokenizer) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        unk = getattr(tokenizer.model, "unk_token", None)
        self.unk_token: str = unk if unk is not None else "[UNK]"
        self.unk_piece = tokenizer.token_to_id(unk) if unk is not None else None
        # one past the highest id, not the count of pieces: a vocabulary may leave ids unused
        # (disan.distill.whole_words reads words at ids that follow a word table's rows)
        self._ids = max(tokenizer.get_vocab().values(), default=-1) + 1

    @classmethod
    def from_file(cls, path: str | Path) -> PieceTokenizer:
        tokenizers = require("tokenizers", "embed")
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    @classmethod
    def from_str(cls, text: str) -> PieceTokenizer:
        tokenizers = require("tokenizers", "embed")
        return cls(tokenizers.Tokenizer.from_str(text))

    def __len__(self) -> int:
        """Rows of the model's table: every piece, plus padding."""
        return self._ids + SHIFT

    def __contains__(self, piece: str) -> bool:
        return self._tok.token_to_id(piece) is not None

    def __eq__(self, other: object) -> bool:
        """Same tokenizer.json, so the same ids for every text (as `Vocab` compares its words)."""
        return isinstance(other, PieceTokenizer) and self.to_str() == other.to_str()

    __hash__ = None  # equal by content, which may change under a hash: not a dict key, as `Vocab` is not

    @property
    def unk_id(self) -> int:
        """The model id an empty text reads as (every row needs one position)."""
        return SHIFT if self.unk_piece is None else self.unk_piece + SHIFT

    def batch_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Model ids of each text's pieces (an empty text: no ids); one Rust call for the batch."""
        return [[i + SHIFT for i in enc.ids]
                for enc in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def tokens(self, text: str) -> list[str]:
        """Raw text -> the pieces the model reads."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def words(self, text: str) -> list[str]:
        """The words a text is split into before pieces (normalized: lower case, no accents)."""
        tok, text = self._tok, str(text)
        text = tok.normalizer.normalize_str(text) if tok.normalizer else text
        return [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text)] if tok.pre_tokenizer else text.split()

    def ids(self, pieces: Sequence[str]) -> list[int]:
        """Model ids of `pieces` (strings from `tokens`); a string that is no piece reads as unknown."""
        unk = self.unk_id
        out = []
        for piece in pieces:
            i = self._tok.token_to_id(piece)
            out.append(unk if i is None else i + SHIFT)
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Model ids -> text, as the tokenizer's decoder joins its pieces ("cur ##cum ##in" ->
        "curcumin"); padding (0) has no text, special pieces are left out with
        `skip_special_tokens`. ValueError naming the first id that is no piece."""
        pieces = [i - SHIFT for i in ids if i != PAD]
        bad = next((i + SHIFT for i in pieces if not 0 <= i < self._ids or self._tok.id_to_token(i) is None),
                   None)
        if bad is not None:
            raise ValueError(f"{bad} is no token id of this model's tokenizer")
        return self._tok.decode(pieces, skip_special_tokens=skip_special_tokens)

    def token_ids(self, words: Sequence[str], max_len: int | None = None) -> list[int]:
        """Word-tokenized text (the staged datasets' form) -> piece ids cut to `max_len`."""
        return self.batch_ids([" ".join(words)])[0][:max_len]

    def text_ids(self, text: str, max_len: int | None = None) -> list[int]:
        """Raw text -> ids cut to `max_len`; an empty text reads as the unknown piece."""
        return self.batch_ids([text])[0][:max_len] or [self.unk_id]

    def encode(self, texts: Sequence[str], max_len: int | None = None, min_len: int = 1) -> Encoded:
        """Tokenize and pad `texts` (see `text_ids`)."""
        return pad_rows([ids[:max_len] or [self.unk_id] for ids in self.batch_ids(texts)], min_len)

    pad = staticmethod(pad_rows)

    def pieces_by_id(self) -> list[str]:
        """Each model id's piece string ("" for padding and any id no piece has): the table's rows
        as text."""
        pieces = [""] * len(self)
        for piece, i in self._tok.get_vocab().items():
            pieces[i + SHIFT] = piece
        return pieces

    def special_ids(self) -> list[int]:
        """Piece ids of the special tokens ("<s>", "[UNK]", ...; Hugging Face's added tokens)."""
        return [i for i, added in self._tok.get_added_tokens_decoder().items() if added.special]

    def index_spelling(self) -> None:
        """Nothing to index: the word vocabulary's spelling fallback has no use here."""

    def to_str(self) -> str:
        return self._tok.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(), encoding="utf-8")


AnyTokenizer = Vocab | PieceTokenizer  # what a graph of a bundle reads text through


def read_tokenizer(path: str | Path) -> AnyTokenizer:
    """The tokenizer a bundle file holds: the word `Vocab` (a disan-vocab JSON) or a Hugging Face
    tokenizer.json (`PieceTokenizer`). Raises ValueError/OSError naming what is wrong."""
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)
    if isinstance(data, dict) and data.get("format") == "disan-vocab":
        return Vocab.from_json(data)
    return PieceTokenizer.from_str(text)
