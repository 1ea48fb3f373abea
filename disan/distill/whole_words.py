"""`disan distill whole-words STUDENT TASK_MODEL OUT`: a piece encoder that reads the words of the
bundle's word table whole, and every other string as pieces.

A subword student splits most words past its 30k pieces ("unwatchable" reads `un ##watch ##able`),
and what a sentence means then rests on how well its blocks learnt to join pieces. A bundle already
holds a trained word table: the one the NLI and sentiment models borrow (`disan borrow-words`),
the word encoder's 187k rows, int8/int4, in the bundle's word order. This gives the piece encoder
that table (read from a model that borrows it) as its `borrowed` buffer and adds each of its words
to the tokenizer's vocabulary as a whole piece, at the id `borrowed_offset + row`
(`disan.model.DiSANEncoder.word_vectors`). WordPiece matches the longest piece first, so a word
the table has reads as its row; a string it lacks still reads as pieces.

The rows are read through a linear map fitted (least squares) from the word rows to the student's
own rows over the words that are whole pieces of both, as borrow-words fits one; for a student
grafted from this word encoder (`research/pieces_from_words.py`) those rows are the word rows
themselves and the map is the identity. A piece whose row is its word's row read through the map
(within SAME_ROW) is then read from the word table too, and its row leaves the student's own
table: the bundle holds it once (for a graft, 22,779 of 30,527 pieces). The other pieces keep
their rows, renumbered in order, so a text reads the same vectors as before.

Only words the tokenizer can meet whole are added: one pre-token, unchanged by its normalizer
(lower case, no accents), not already a piece, and with a row of their own (not the UNK row a
bundle word the word encoder lacks carries). The ids of the rows it cannot meet (padding, UNK,
words already pieces, "u.n.", upper case) stay unused, so each word's id stays in step with its
row. In a bundle the table is the task models' borrowed table, the same bytes, stored once
(`model_export.embed.as_stored`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from disan.distill.borrow_words import TASKS
from disan.distill.vocab_extend import fit_map
from disan.model import BORROWED_KEY
from disan.text.pieces import SHIFT, PieceTokenizer
from disan.text.tokenizer import UNK
from disan.train.checkpoint import PROVENANCE_KEYS, load_checkpoint, provenance, write_checkpoint


def readable_words(tok: PieceTokenizer, words: list[str], limit: int | None) -> list[int]:
    """Rows of `words` (past UNK, the first `limit`) that the tokenizer meets whole (one word,
    unchanged by its normalizer) and does not read as one piece already."""
    return [row for row, word in enumerate(words[:limit])
            if row > UNK and word and word not in tok and tok.words(word) == [word]]


# Where the word table's tokenizer (disan.text.tokenizer) splits a word that BERT's pre-tokenizer
# splits elsewhere: a clitic is one token ("does n't", "he 's"), not "doesn ' t" / "he ' s". The
# rest is BERT's split: whitespace, then each symbol on its own.
WORD_SPLIT = r"n't\b|'(?:s|re|ve|ll|d|m)\b|[^\w\s]|_"
SAME_ROW = 1e-4  # a piece row within this (relative) of its mapped word row is that row
QUOTES = {"\u2018": "'", "\u2019": "'"}  # typographic apostrophes read as the ASCII one


def split_like_words(tok: PieceTokenizer):
    """A copy of `tok`'s Hugging Face tokenizer that splits text into words as the word table's
    tokenizer did (WORD_SPLIT, after its own normalizer and curly apostrophes made straight), so
    that the table's "n't" and "'s" can be read whole."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers  # the embed extra, as PieceTokenizer

    backend = Tokenizer.from_str(tok.to_str())
    steps = [normalizers.Replace(k, v) for k, v in QUOTES.items()]
    backend.normalizer = normalizers.Sequence([*steps, backend.normalizer] if backend.normalizer else steps)
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(WORD_SPLIT), behavior="isolated")])
    return backend


def lent_table(lender: dict) -> tuple[list[str], torch.Tensor]:
    """(words, table [len(words), d]) of the word table `lender` gives: the one an NLI or sentiment
    model borrowed (`disan borrow-words`), in the bundle's word order, or a word encoder's own."""
    config, state = lender["config"], lender["model_state"]
    if config.get("task") in TASKS and config.get("borrowed_rows"):
        return list(lender["vocab"]), state[BORROWED_KEY].float()
    if config.get("task") == "encoder" and lender.get("vocab"):
        return list(lender["vocab"]), state["embed.weight"].float()
    raise ValueError("the words must come from an NLI or sentiment model that borrows a word table "
                     "(disan borrow-words) or from a word encoder (task 'encoder' with a word list)")


def whole_words(student: dict, lender: dict, limit: int | None = None) -> tuple[dict, dict]:
    """(`student` reading `lender`'s words whole through its table, a report)."""
    if not student.get("tokenizer"):
        raise ValueError("whole-words takes a piece encoder (a checkpoint with a tokenizer.json, "
                         "from `disan distill student`)")
    config = dict(student["config"])
    if config.get("borrowed_rows"):
        raise ValueError("the student reads a word table already")
    words, table = lent_table(lender)
    tok = PieceTokenizer.from_str(student["tokenizer"])
    own = config["vocab_size"]
    if len(tok) != own:
        raise ValueError(f"the student's table has {own} rows, its tokenizer {len(tok)} ids")
    tok = PieceTokenizer(split_like_words(tok))
    unk_rows = set(np.flatnonzero((table == table[UNK]).all(1).numpy()).tolist())  # words it lacks
    rows = [r for r in readable_words(tok, words, limit) if r not in unk_rows]
    if not rows:
        raise ValueError("no word of the lender's table would read whole")
    state = dict(student["model_state"])
    mine = state["embed.weight"].float().numpy()
    shared = [(tok.ids([w])[0], r) for r, w in enumerate(words) if r > UNK and r not in unk_rows and w in tok]
    if len(shared) <= table.shape[1] + 1:
        raise ValueError(f"the two share {len(shared)} words: too few to fit a map from {table.shape[1]} "
                         "dimensions")
    mine_ids, word_rows = (np.asarray(x) for x in zip(*shared, strict=True))
    lent = table[word_rows].numpy().astype(np.float64)
    mapping, cosine = fit_map(lent, mine[mine_ids].astype(np.float64))
    # A piece whose row is its word's row read through the map (a graft's whole-word pieces) is
    # read from the word table instead: the bundle then holds that row once, not twice.
    gap = np.linalg.norm(np.hstack([lent, np.ones((len(lent), 1))]) @ mapping - mine[mine_ids], axis=1)
    same = (gap <= SAME_ROW * np.linalg.norm(mine[mine_ids], axis=1)) & ~np.isin(
        mine_ids, [i + SHIFT for i in tok.special_ids()])
    moved = dict(zip(mine_ids[same].tolist(), word_rows[same].tolist(), strict=True))  # model id -> row
    keep = [i for i in range(own) if i not in moved]
    wide = widened(tok, {words[r]: r for r in rows}, moved, keep)

    state["embed.weight"] = torch.from_numpy(mine[keep])
    if "trainable_rows" in state:
        state["trainable_rows"] = state["trainable_rows"][keep].clone()
    state["borrowed"] = table.clone()
    state["borrow_map.weight"] = torch.from_numpy(mapping[:-1].T.astype(np.float32))
    state["borrow_map.bias"] = torch.from_numpy(mapping[-1].astype(np.float32))
    kept = len(keep)
    config |= {"vocab_size": kept, "borrowed_rows": table.shape[0], "borrowed_dim": table.shape[1],
               "borrowed_offset": kept}
    report = {"pieces": kept - SHIFT, "whole_words": len(rows), "pieces_read_from_the_table": len(moved),
              "ids": len(wide) - SHIFT, "fit_words": len(shared), "fit_heldout_cosine": round(cosine, 4)}
    return {**student, "config": config, "model_state": state, "tokenizer": wide.to_str()}, report


def widened(tok: PieceTokenizer, added: dict[str, int], moved: dict[int, int],
            keep: list[int]) -> PieceTokenizer:
    """`tok` reading the `added` words ({word: row}) and the `moved` pieces ({model id: row}) at id
    len(keep) + row, the pieces it `keep`s at their rank among them; the other rows' ids stay unused."""
    kept, new_id = len(keep), {old: new for new, old in enumerate(keep)}

    def renumber(piece_id: int) -> int:  # piece ids: model id - SHIFT
        model_id = piece_id + SHIFT
        return (kept + moved[model_id] if model_id in moved else new_id[model_id]) - SHIFT

    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for piece, i in vocab.items():
        vocab[piece] = renumber(i)
    for token in data.get("added_tokens") or []:
        token["id"] = renumber(token["id"])
    renumber_post_processor(data.get("post_processor"), renumber)
    vocab.update({word: kept - SHIFT + row for word, row in added.items()})
    return PieceTokenizer.from_str(json.dumps(data, ensure_ascii=False))


def renumber_post_processor(processor: dict | None, renumber) -> None:
    """Give the special tokens a post-processor names (never used: DiSAN adds none) their new ids,
    so the tokenizer.json stays consistent."""
    if not processor:
        return
    for key in ("sep", "cls"):  # RobertaProcessing, BertProcessing: [token, id]
        if isinstance(processor.get(key), list):
            processor[key][1] = renumber(processor[key][1])
    for token in (processor.get("special_tokens") or {}).values():  # TemplateProcessing
        token["ids"] = [renumber(i) for i in token.get("ids", [])]
    for step in processor.get("processors") or []:  # Sequence
        renumber_post_processor(step, renumber)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("student", type=Path, help="a piece encoder (`disan distill student`)")
    parser.add_argument("words", type=Path, help="the NLI or sentiment model that borrows the bundle's "
                        "word table (`disan borrow-words`): its words, in the bundle's order, are read "
                        "whole (or a word encoder: its own table)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-words", type=int, default=None,
                        help="read only the table's first N words whole (its most frequent; a smaller "
                        "tokenizer.json); default: all")


def run(args: argparse.Namespace) -> int:
    if args.max_words is not None and args.max_words < 1:
        raise ValueError(f"--max-words must be >= 1, got {args.max_words}")
    student, lender = load_checkpoint(args.student), load_checkpoint(args.words)
    out, report = whole_words(student, lender, args.max_words)
    out = {k: v for k, v in out.items() if k not in ("student_state", *PROVENANCE_KEYS)}
    out["whole_words"] = report | {"from": provenance(args.student, student),
                                   "lender": provenance(args.words, lender)}
    write_checkpoint(args.out, out)
    print(f"{args.out}: reads {report['whole_words']} more words whole, "
          f"{report['pieces_read_from_the_table']} pieces from the word table, "
          f"{report['pieces']} pieces of its own ({report['ids']} ids; map fitted on "
          f"{report['fit_words']} shared words, held-out cosine {report['fit_heldout_cosine']})")
    return 0
