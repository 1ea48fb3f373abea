"""Subword pieces (TORCH-FREE): the tokenizer a piece-reading model carries as `tokenizer.json`.

A `PieceTokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (Rust; what text-embeddings-inference
uses) loaded from a `tokenizer.json`: by default the teacher's own WordPiece vocabulary
(all-mpnet-base-v2's 30,527 pieces), so every string maps to known pieces. DiSAN reads the pieces
alone: no [CLS]/[SEP] are added, and nothing is truncated here (windows are the runtime's business).
Padding is id 0 in the model's input, so piece ids are shifted by one: model id = piece id + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from disan.optional import require

PAD = 0
SHIFT = 1  # model id = piece id + SHIFT, so that 0 is padding


class PieceTokenizer:
    def __init__(self, tokenizer) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self.unk_piece = tokenizer.token_to_id(tokenizer.model.unk_token) if hasattr(
            tokenizer.model, "unk_token") else None

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
        return self._tok.get_vocab_size() + SHIFT

    @property
    def unk_id(self) -> int | None:
        return None if self.unk_piece is None else self.unk_piece + SHIFT

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Model ids of each text's pieces (an empty text: no ids)."""
        return [[i + SHIFT for i in enc.ids]
                for enc in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def pieces(self, text: str) -> list[str]:
        return self._tok.encode(text, add_special_tokens=False).tokens

    def to_str(self) -> str:
        return self._tok.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(), encoding="utf-8")
