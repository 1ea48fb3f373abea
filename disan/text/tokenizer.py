"""Tokenizer and vocabulary, shared by training and serving (TORCH-FREE: only stdlib + numpy).

The training data (SST trees, tokenized SNLI) is PTB-tokenized with escapes such as ``-LRB-``,
`` `` `` and ``\\/``; users send raw text. `tokenize` maps both to the same lowercased tokens:
it first undoes the PTB escapes, then splits punctuation and clitics PTB-style, so
"doesn't (really)" and "does n't -LRB- really -RRB-" give identical tokens.
"""

from __future__ import annotations

import json
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAD, UNK = 0, 1
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"

# PTB escapes -> the raw characters they stand for (applied to whole tokens, case-insensitively).
_PTB_ESCAPES = {
    "-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}",
    "``": '"', "''": '"',
}
_PTB_ESCAPE_RE = re.compile(r"(?<!\S)(-[lr][rsc]b-|``|'')(?!\S)", re.IGNORECASE)
# Curly quotes and similar typography map to the ASCII forms the training text uses.
_TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                             "\u2013": "-", "\u2014": "--", "\u2026": "..."})
_NEGATION_RE = re.compile(r"(\w)(n't)\b", re.IGNORECASE)
_CLITIC_RE = re.compile(r"(\w)('(?:s|re|ve|ll|d|m))\b", re.IGNORECASE)
_CANNOT_RE = re.compile(r"\b(can)(not)\b", re.IGNORECASE)
_TOKEN_RE = re.compile(
    r"n't\b"                          # clitic negation, split off by _NEGATION_RE
    r"|'(?:s|re|ve|ll|d|m)\b"         # clitics: 's 're 've 'll 'd 'm
    r"|\.\.\.|--"                     # PTB keeps these as single tokens
    r"|\w+(?:[-./]\w+)*"              # words, numbers (3.5), hyphenated words, a/b
    r"|[^\w\s]",                      # any other single symbol
    re.IGNORECASE,
)
# The same pattern for text already lowercased (ASCII): case-folding is then wasted work.
_LOWER_TOKEN_RE = re.compile(_TOKEN_RE.pattern)
# A compound's joints: "first-past-the-post", "animate/inanimate" (kept as pieces of their own).
_JOINT_RE = re.compile(r"([-/])")
# ASCII's control characters (category Cc: 0-31 and 127), each replaced by a space like any "C" character.
_ASCII_CONTROLS = dict.fromkeys([*range(32), 127], " ")
# An unknown word of SPELLING_LETTERS a-z letters is read as a known word one edit away (`Vocab.
# spelled`). Shorter words have too many neighbours to guess from; longer runs of letters are
# rarely misspelt words.
SPELLING_LETTERS = range(5, 25)
# What PTB splits off before "n't" ("didn't" -> did n't, "can't" -> ca n't): an unknown "didnt"
# is read the same way, before any spelling guess could drop the negation ("wasnt" -> "want").
_NEGATED = frozenset("do does did is are was were has have had could should would must need might "
                     "ca wo ai sha".split())
_SPELLING_CACHE = 65_536  # answers kept per vocabulary (then forgotten): bounded memory
_NOT_ASKED = object()


def tokenize(text: str) -> list[str]:
    """Lowercased PTB-style tokens of raw or already PTB-tokenized `text`."""
    return _tokenize_ascii(text) if text.isascii() else _tokenize_general(text)


def _tokenize_general(text: str) -> list[str]:
    """`tokenize` for any text (the reference the ASCII path must agree with)."""
    text = unicodedata.normalize("NFKC", text).translate(_TYPOGRAPHY)
    if not text.isprintable():  # printable text has no control/format chars: skip the slow scan
        text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    text = _PTB_ESCAPE_RE.sub(lambda m: _PTB_ESCAPES[m.group(1).lower()], text)
    text = text.replace("\\/", "/").replace("\\*", "*").replace("`", "'")
    text = _CANNOT_RE.sub(r"\1 \2", text)
    text = _NEGATION_RE.sub(r"\1 \2", text)
    text = _CLITIC_RE.sub(r"\1 \2", text)
    return [tok.lower() for tok in _TOKEN_RE.findall(text)]


def _tokenize_ascii(text: str) -> list[str]:
    """`tokenize` for ASCII text: the same tokens with less work (the service's hot path; the
    saving is measured by bench/stages.py, figures in bench/RESULTS.md).

    ASCII text is its own NFKC form and has no typography to map, and lowercasing ASCII changes
    no character class, so the text is lowercased once up front instead of token by token. Each
    rewrite runs only when the text holds the literal its pattern needs (`str.__contains__` is
    far cheaper than a regex scan). No token spans a space and a word's edges look the same to
    `\\b` whether a space or the text's end is next, so words are tokenized one by one: a word
    of letters/digits is one `\\w+` token and a lone character one token, without the regex.
    tests/disan/text/test_text.py checks this path against the general one on random text.
    """
    if not text.isprintable():
        text = text.translate(_ASCII_CONTROLS)
    text = text.lower()
    if "-" in text or "``" in text or "''" in text:
        text = _PTB_ESCAPE_RE.sub(lambda m: _PTB_ESCAPES[m.group(1)], text)
    if "\\" in text:
        text = text.replace("\\/", "/").replace("\\*", "*")
    if "`" in text:
        text = text.replace("`", "'")
    if "cannot" in text:
        text = _CANNOT_RE.sub(r"\1 \2", text)
    if "n't" in text:
        text = _NEGATION_RE.sub(r"\1 \2", text)
    # No _CLITIC_RE pass: _TOKEN_RE already ends a word at "'" and matches the clitic on its
    # own, so the spaces that pass inserts never change the tokens.
    tokens: list[str] = []
    for word in text.split(" "):  # the only whitespace left is " " (controls became spaces)
        if word.isalnum() or len(word) == 1:
            tokens.append(word)
        elif word:
            tokens += _LOWER_TOKEN_RE.findall(word)
    return tokens


class _OneEdit:
    """The vocabulary's words one edit from a query, without trying the ~54 strings per letter
    that are one edit from it (Norvig's `edits1`: a request full of long unknown words would cost
    a millisecond a word on the event loop).

    Every known word of SPELLING_LETTERS or one more letter is indexed under each of its
    deletions (the word with letter i left out), as sorted 64-bit hashes (Python's `hash`, so an
    index is only good in the process that built it: `Vocab` never pickles one). For a query q of n letters:
    a known word with q's letter i replaced shares q's deletion at i (same length, same i); one
    with a letter deleted from q is q's deletion itself (a plain lookup); one with a letter
    inserted has q as one of its deletions; a swap of neighbours is looked up directly. Hash
    matches are checked against the words themselves, so a collision never answers.
    """

    def __init__(self, itos: Sequence[str], stoi: dict[str, int]):
        low, high = SPELLING_LETTERS.start, SPELLING_LETTERS.stop
        words = np.array([i for i, w in enumerate(itos)
                          if i > UNK and low <= len(w) <= high and w.isascii() and w.isalpha()],
                         dtype=np.int32)
        sizes = np.array([len(itos[i]) for i in words], dtype=np.int64)
        # Streamed into arrays, never Python lists: a list of Python ints costs several times the
        # array it becomes, and that moment can be a process's peak resident set (bench.memory).
        keys = np.fromiter((hash(w[:j] + w[j + 1:]) for w in map(itos.__getitem__, words)
                            for j in range(len(w))), dtype=np.int64, count=int(sizes.sum()))
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]                                             # [N] sorted
        del keys
        self.ids = np.repeat(words, sizes)[order]                           # [N] word id
        starts = np.repeat((np.cumsum(sizes) - sizes).astype(np.int32), sizes)    # [N] its word's first key
        self.where = (np.arange(len(order), dtype=np.int32) - starts)[order].astype(np.int8)  # [N] letter out
        self.itos, self.stoi = itos, stoi

    def nearest(self, q: str) -> int | None:
        """The smallest id of a known word one edit from the unknown word `q` (letters only, so
        never PAD or UNK), or None."""
        stoi, n = self.stoi, len(q)
        gone = [q[:j] + q[j + 1:] for j in range(n)]                        # q's deletions
        found = [stoi[g] for g in gone if g in stoi]                        # q has a letter too many
        found += [stoi[s] for j in range(n - 1)                             # two neighbours swapped
                  if (s := q[:j] + q[j + 1] + q[j] + q[j + 2:]) in stoi]
        keys = [*gone, q]
        hashes = np.array([hash(k) for k in keys], dtype=np.int64)
        starts = np.searchsorted(self.keys, hashes, "left")
        ends = np.searchsorted(self.keys, hashes, "right")
        for j in np.flatnonzero(ends > starts):
            for row in range(starts[j], ends[j]):
                i, at = int(self.ids[row]), int(self.where[row])
                w = self.itos[i]
                if w[:at] + w[at + 1:] != keys[j]:
                    continue                                                # a hash collision
                if j == n or (at == j and len(w) == n):                     # q lacks a letter / one replaced
                    found.append(i)
        return min(found) if found else None


@dataclass
class Encoded:
    """A padded batch: `ids` int64 [B, n] and `mask` bool [B, n]; `lengths` before padding."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: list[int]


def pad_rows(rows: Sequence[Sequence[int]], min_len: int = 1) -> Encoded:
    """Right-pad id lists into an `Encoded` batch."""
    lengths = [len(r) for r in rows]
    width = max([min_len, *lengths])
    ids = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return Encoded(ids=ids, mask=ids != PAD, lengths=lengths)


class Vocab:
    """Word <-> id map with PAD=0 and UNK=1, saved as JSON next to the model.

    With `unknown_rows` K > 0 an unknown word does not read as UNK: it reads as one of the last K
    (rarest) words, the same one every time (CRC-32 of its spelling, mod K). Why: two texts that
    share a word the model lacks ("guillemets", a name, a number) then share that word's row and
    come out closer, where UNK would make every unknown word alike; what the row means matters
    less than that it is the same in both texts. The rows are existing ones, so this costs no
    bytes; a model whose table is shorter than the vocabulary (a bundle's NLI and sentiment
    models) reads those ids as UNK, as it reads every id past its table."""

    unk_id = UNK  # what an empty text reads as (every row needs one position)
    unk_token = UNK_TOKEN

    def __init__(self, words: Iterable[str], unknown_rows: int = 0):
        self.itos: list[str] = [PAD_TOKEN, UNK_TOKEN]
        self.stoi: dict[str, int] = {PAD_TOKEN: PAD, UNK_TOKEN: UNK}
        self.spelling = True  # read misspelt unknown words as known ones (`spelled`); a setting
        self._spelled: dict[str, str | None] = {}
        self._one_edit: _OneEdit | None = None  # built on the first unknown word that needs it
        for word in words:
            if word not in self.stoi:
                self.stoi[word] = len(self.itos)
                self.itos.append(word)
        if not 0 <= unknown_rows <= len(self.itos) - 2:
            raise ValueError(f"unknown_rows must be 0 to the {len(self.itos) - 2} words, not {unknown_rows}")
        self.unknown_rows = unknown_rows

    def __len__(self) -> int:
        return len(self.itos)

    def __getstate__(self) -> dict:
        # The spelling index holds this process's string hashes: another process rebuilds it.
        return {**self.__dict__, "_spelled": {}, "_one_edit": None}

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Vocab) and self.itos == other.itos
                and self.unknown_rows == other.unknown_rows)

    def ids(self, tokens: Sequence[str]) -> list[int]:
        """Token ids, one per token (see `pieces`); an unknown token gets UNK, or with
        `unknown_rows` its hashed row (`unknown_id`)."""
        if not self.unknown_rows:
            return [self.stoi.get(tok, UNK) for tok in tokens]
        ids = [self.stoi.get(tok, -1) for tok in tokens]  # the common case: every token known
        if -1 in ids:
            ids = [i if i >= 0 else self.unknown_id(tok) for i, tok in zip(ids, tokens, strict=True)]
        return ids

    def unknown_id(self, token: str) -> int:
        """The id an unknown `token` reads as: UNK, or one of the last `unknown_rows` words."""
        if not self.unknown_rows:
            return UNK
        # surrogatepass: a token that skipped `tokenize` may hold a lone surrogate; hash it anyway
        key = zlib.crc32(token.encode("utf-8", "surrogatepass"))
        return len(self.itos) - self.unknown_rows + key % self.unknown_rows

    def pieces(self, tokens: Sequence[str]) -> list[str]:
        """`tokens` as this vocabulary reads them: a compound it lacks whose words it all knows
        ("non-physical", "on/in") becomes those words and its joints (where it knows them),
        instead of one UNK, a negation written without its apostrophe ("didnt") becomes the
        PTB pieces of the one with it (`did n't`), and a misspelt word the known word one edit
        away (`spelled`). Known tokens, and compounds with an unknown word, stay whole. Ids come
        from these pieces, one each, so explanations and limits count what the model sees."""
        out: list[str] = []
        for tok in tokens:
            if tok in self.stoi or len(tok) < 3:
                out.append(tok)
                continue
            if tok.endswith("nt") and tok[:-2] in _NEGATED and tok[:-2] in self.stoi:
                out += [tok[:-2], "n't"]                                    # "didnt": did n't
                continue
            if "-" not in tok and "/" not in tok:
                out.append((self.spelling and self.spelled(tok)) or tok)
                continue
            parts = [p for p in _JOINT_RE.split(tok) if p]
            if all(p in self.stoi for p in parts if p not in ("-", "/")):
                out.extend(p for p in parts if p in self.stoi)  # a joint it lacks is dropped
            else:
                out.append(tok)
        return out

    def spelled(self, word: str) -> str | None:
        """The known word one edit (a letter deleted, inserted, replaced, or two neighbours
        swapped) from the unknown word `word` ("ingrediants" -> "ingredients"), the earliest in
        the vocabulary where there are several (vocabularies list their most frequent words
        first); None if there is none, or `word` is not 5 to 24 letters a-z. `/tokenize` shows
        what the model reads. A few microseconds a word (`_OneEdit`), answers cached."""
        if len(word) not in SPELLING_LETTERS or not (word.isascii() and word.isalpha()):
            return None
        if (known := self._spelled.get(word, _NOT_ASKED)) is not _NOT_ASKED:
            return known
        found = self.index_spelling().nearest(word)
        answer = self.itos[found] if found is not None else None
        if len(self._spelled) >= _SPELLING_CACHE:  # threads may tokenize at once: the answer is
            self._spelled.clear()                  # returned from here, never read back
        self._spelled[word] = answer
        return answer

    def index_spelling(self) -> _OneEdit:
        """The index behind `spelled`, built on first use (a quarter of a second for 100k
        words; a server builds it while it loads, not on its first misspelt word)."""
        if self._one_edit is None:
            self._one_edit = _OneEdit(self.itos, self.stoi)
        return self._one_edit

    def tokens(self, text: str) -> list[str]:
        """Raw text -> the pieces the model reads (`tokenize`, then `pieces`)."""
        return self.pieces(tokenize(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids -> their words joined by spaces (the text as the model read it: lower case,
        PTB-split); PAD and UNK left out with `skip_special_tokens`. ValueError naming the first
        id that is no word here."""
        bad = next((i for i in ids if not 0 <= i < len(self.itos)), None)
        if bad is not None:
            raise ValueError(f"{bad} is no token id of this model (0 to {len(self.itos) - 1})")
        return " ".join(self.itos[i] for i in ids if not (skip_special_tokens and i in (PAD, UNK)))

    def token_ids(self, tokens: Sequence[str], max_len: int | None = None) -> list[int]:
        """Tokenized text -> the ids of its pieces, cut to `max_len` (the one way training data,
        evaluation and raw text become model input)."""
        return self.ids(self.pieces(tokens)[:max_len])

    def text_ids(self, text: str, max_len: int | None = None) -> list[int]:
        """Raw text -> ids cut to `max_len`; an empty text becomes one UNK (every row needs one
        valid position; the service rejects empty texts before this point)."""
        return self.token_ids(tokenize(text), max_len) or [UNK]

    def encode(self, texts: Sequence[str], max_len: int | None = None,
               min_len: int = 1) -> Encoded:
        """Tokenize and pad `texts` (see `text_ids`)."""
        return self.pad([self.text_ids(t, max_len) for t in texts], min_len=min_len)

    pad = staticmethod(pad_rows)

    def to_json(self) -> dict:
        extra = {"unknown_rows": self.unknown_rows} if self.unknown_rows else {}
        return {"format": "disan-vocab", "version": 1, "pad": PAD, "unk": UNK, **extra, "itos": self.itos}

    @classmethod
    def from_json(cls, data: dict) -> Vocab:
        if data.get("format") != "disan-vocab" or data.get("itos", [None, None])[:2] != [
            PAD_TOKEN, UNK_TOKEN
        ]:
            raise ValueError("not a disan vocab (expected format 'disan-vocab' with <pad>, <unk> first)")
        return cls(data["itos"][2:], unknown_rows=int(data.get("unknown_rows", 0)))

    def save(self, path: str | Path) -> None:
        # compact: a bundle's word list is 187k strings, and ", " between them is 187 KB of its budget
        Path(path).write_text(json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")),
                              encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def merged_vocab(base: Vocab, extra: Vocab) -> Vocab:
    """`base`'s words, then `extra`'s words `base` lacks, in `extra`'s order; `extra`'s hashed
    unknown rows (its last words) stay the last ones, so they must be words `base` lacks."""
    k = extra.unknown_rows
    merged = Vocab([*base.itos[2:], *(w for w in extra.itos[2:] if w not in base)], unknown_rows=k)
    if k and merged.itos[-k:] != extra.itos[-k:]:
        raise ValueError(f"the encoder's last {k} words stand for unknown words, but the NLI/sentiment "
                         f"vocabulary has some of them: they would not stay last in the bundle's")
    return merged
