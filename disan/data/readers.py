"""Dataset readers, label mapping and token-id encoding (TORCH-FREE; batching is disan.runtime.batching).

Supported files (plain or gzip, detected by content, not by name):
  * NLI jsonl: official SNLI / MultiNLI (`sentence1`, `sentence2`, `gold_label`; '-' dropped),
    also the staged tokenized SNLI files (same fields).
  * SICK: staged jsonl (`sentence_a`, `sentence_b`, `entailment`) or the official tab-separated
    txt (`sentence_A`, `sentence_B`, `entailment_label` or `entailment_judgment`).
  * SST PTB trees, one per line: the root label (sentence level) or every distinct span
    (phrase level, as the paper trains).
  * text/label jsonl (`text`, `label`): staged SST and SentEval tasks.

Every user-data problem raises ValueError with one line that names the file (and line).
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from disan.bundle.manifest import NLI_LABELS
from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, RECIPES
from disan.text.tokenizer import Vocab, tokenize


@dataclass(frozen=True)
class Example:
    """One example: 1 (sentiment) or 2 (premise, hypothesis) token tuples and a raw label."""

    texts: tuple[tuple[str, ...], ...]
    label: str
    where: str  # "file:line", for error messages


@dataclass
class Dataset:
    """Examples of one task with labels mapped to ids in `labels` order."""

    task: str                 # "nli" | "sentiment"
    examples: list[Example]
    label_ids: list[int]

    def __len__(self) -> int:
        return len(self.examples)


def open_text(path: Path, errors: str = "strict") -> io.TextIOBase:
    """Open a plain or gzip (detected by magic bytes) UTF-8 text file; a missing path is a ValueError."""
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    with path.open("rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors=errors)
    return path.open("r", encoding="utf-8", errors=errors)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file, plain or gzip (one JSON object per non-blank line)."""
    with open_text(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped line) for non-blank lines; errors name the file."""
    try:
        with open_text(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    yield lineno, line.rstrip("\n\r")
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from exc


def _tokens(text: object, where: str, field: str) -> tuple[str, ...]:
    if not isinstance(text, str):
        raise ValueError(f"{where}: field '{field}' must be a string")
    toks = tuple(tokenize(text))
    if not toks:
        raise ValueError(f"{where}: field '{field}' has no tokens")
    return toks


def _nli_label(raw: object, where: str) -> str | None:
    label = str(raw).strip().lower()
    if label == "-":
        return None  # no annotator majority: dropped, as in the official setup
    if label not in NLI_LABELS:
        raise ValueError(f"{where}: unknown NLI label {raw!r} (expected one of {NLI_LABELS} or '-')")
    return label


def detect_format(path: str | Path) -> str:
    """'nli-jsonl' | 'sick-jsonl' | 'sick-txt' | 'sst-trees' | 'text-jsonl' from the first line."""
    path = Path(path)
    for lineno, line in _lines(path):
        first = line.lstrip()
        if first.startswith("{"):
            try:
                keys = set(json.loads(first))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({exc})") from exc
            if {"sentence1", "sentence2", "gold_label"} <= keys:
                return "nli-jsonl"
            if {"sentence_a", "sentence_b", "entailment"} <= keys:
                return "sick-jsonl"
            if {"text", "label"} <= keys:
                return "text-jsonl"
            raise ValueError(f"{path}:{lineno}: unrecognised JSON fields {sorted(keys)}")
        if first.startswith("("):
            return "sst-trees"
        if "\t" in first and "sentence_A" in first.split("\t"):
            return "sick-txt"
        raise ValueError(f"{path}:{lineno}: unrecognised format (expected jsonl, SST trees or SICK txt)")
    raise ValueError(f"{path}: file is empty")


def _read_jsonl(path: Path, fmt: str) -> Iterator[Example]:
    fields = {"nli-jsonl": ("sentence1", "sentence2", "gold_label"),
              "sick-jsonl": ("sentence_a", "sentence_b", "entailment"),
              "text-jsonl": ("text", None, "label")}[fmt]
    for lineno, line in _lines(path):
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: malformed JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object")
        missing = [f for f in fields if f is not None and f not in row]
        if missing:
            raise ValueError(f"{where}: missing field '{missing[0]}'")
        a, b, lab = fields
        if fmt == "text-jsonl":
            raw = row[lab]
            if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                raise ValueError(f"{where}: label must be an integer or a string, got {raw!r}")
            yield Example((_tokens(row[a], where, a),), str(raw), where)
            continue
        label = _nli_label(row[lab], where)
        if label is not None:
            yield Example((_tokens(row[a], where, a), _tokens(row[b], where, b)), label, where)


def _read_sick_txt(path: Path) -> Iterator[Example]:
    lines = _lines(path)
    _, header = next(lines)
    cols = header.split("\t")
    label_col = next((c for c in ("entailment_label", "entailment_judgment") if c in cols), None)
    if label_col is None:
        raise ValueError(f"{path}:1: SICK header has no entailment_label column")
    ia, ib, il = cols.index("sentence_A"), cols.index("sentence_B"), cols.index(label_col)
    for lineno, line in lines:
        where = f"{path}:{lineno}"
        row = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE))
        if len(row) != len(cols):
            raise ValueError(f"{where}: expected {len(cols)} tab-separated fields, got {len(row)}")
        label = _nli_label(row[il], where)
        if label is not None:
            yield Example((_tokens(row[ia], where, "sentence_A"), _tokens(row[ib], where, "sentence_B")),
                          label, where)


def parse_tree(line: str, where: str) -> list[tuple[str, str]]:
    """(label, span text) for every node of one PTB sentiment tree, root first (pre-order)."""
    nodes: list[tuple[str, str]] = []
    pos = 0

    def fail(msg: str) -> ValueError:
        return ValueError(f"{where}: malformed tree ({msg} at character {pos})")

    def node() -> list[str]:
        nonlocal pos
        if line[pos] != "(":
            raise fail("expected '('")
        end = line.find(" ", pos)
        if end < 0:
            raise fail("missing label")
        label, pos = line[pos + 1:end], end + 1
        slot = len(nodes)
        nodes.append((label, ""))
        if line[pos] == "(":
            leaves: list[str] = []
            while pos < len(line) and line[pos] == "(":
                leaves += node()
                while pos < len(line) and line[pos] == " ":
                    pos += 1
        else:  # a leaf: text up to ')' (may hold spaces, e.g. "8 1\/2")
            end = line.find(")", pos)
            if end < 0:
                raise fail("unclosed leaf")
            leaves, pos = [line[pos:end]], end
        if pos >= len(line) or line[pos] != ")":
            raise fail("expected ')'")
        pos += 1
        nodes[slot] = (label, " ".join(leaves))
        return leaves

    try:
        node()
    except IndexError:
        raise fail("unexpected end of line") from None
    if line[pos:].strip():
        raise fail("trailing text")
    return nodes


def _read_trees(path: Path, phrases: bool) -> Iterator[Example]:
    seen: set[str] = set()
    for lineno, line in _lines(path):
        where = f"{path}:{lineno}"
        nodes = parse_tree(line.strip(), where)
        for label, text in nodes if phrases else nodes[:1]:
            if label not in {"0", "1", "2", "3", "4"}:
                raise ValueError(f"{where}: unknown SST label {label!r} (expected 0..4)")
            if phrases:  # every distinct span once, first label seen (as the staged phrase file)
                if text in seen:
                    continue
                seen.add(text)
            yield Example((_tokens(text, where, "tree"),), label, where)


def read_examples(path: str | Path, phrases: bool = False) -> tuple[str, list[Example]]:
    """Read any supported file -> (task 'nli'|'sentiment', examples). `phrases` only affects trees."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "sick-txt":
        examples = list(_read_sick_txt(path))
    elif fmt == "sst-trees":
        examples = list(_read_trees(path, phrases))
    else:
        examples = list(_read_jsonl(path, fmt))
    if not examples:
        raise ValueError(f"{path}: no usable examples")
    return ("sentiment" if fmt in ("sst-trees", "text-jsonl") else "nli"), examples


def label_set(task: str, examples: Sequence[Example]) -> list[str]:
    """NLI: the three fixed labels. Sentiment: the training labels, numerically sorted if integers."""
    if task == "nli":
        return list(NLI_LABELS)
    raw = {ex.label for ex in examples}
    return sorted(raw, key=lambda s: (0, int(s), "") if s.lstrip("-").isdigit() else (1, 0, s))


def make_dataset(task: str, examples: list[Example], labels: Sequence[str]) -> Dataset:
    """Map raw labels to ids; a label outside `labels` is an error naming file and line."""
    index = {lab: i for i, lab in enumerate(labels)}
    ids = []
    for ex in examples:
        if ex.label not in index:
            raise ValueError(f"{ex.where}: unknown label {ex.label!r} (training labels: {list(labels)})")
        ids.append(index[ex.label])
    return Dataset(task, examples, ids)


@dataclass
class EncodedDataset:
    """Token ids per example (one int64 array per sentence) plus label ids."""

    task: str
    ids: list[tuple[np.ndarray, ...]]
    labels: np.ndarray
    soft: np.ndarray | None = None  # a teacher's logits [N, C] (`train --soft-targets`), else None

    def __len__(self) -> int:
        return len(self.labels)

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """Longest sentence of each example (computed once: batching asks for it every step)."""
        return np.asarray([max(len(s) for s in row) for row in self.ids], dtype=np.int64)


def encode_dataset(ds: Dataset, vocab: Vocab, max_len: int | None) -> EncodedDataset:
    """Tokens -> ids (unknown -> UNK), cut to `max_len` tokens."""
    rows = [tuple(np.asarray(vocab.token_ids(t, max_len), dtype=np.int64) for t in ex.texts)
            for ex in ds.examples]
    return EncodedDataset(ds.task, rows, np.asarray(ds.label_ids, dtype=np.int64))


def holdout_split(examples: list[Example], size: int, seed: int) -> tuple[list[Example], list[Example]]:
    """Deterministic held-out slice of about `size` examples -> (rest, held_out).

    Whole groups that share a first sentence (an SNLI premise has ~3 hypotheses) go to one side,
    so no premise is both trained on and used for model selection.
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(ex.texts[0], []).append(i)
    keys = list(groups)
    held: set[int] = set()
    for k in np.random.default_rng(seed).permutation(len(keys)):
        if len(held) >= size:
            break
        held.update(groups[keys[k]])
    if len(held) >= len(examples):
        raise ValueError(f"{examples[0].where.rsplit(':', 1)[0]}: too few examples to hold out {size}")
    return ([ex for i, ex in enumerate(examples) if i not in held],
            [ex for i, ex in enumerate(examples) if i in held])


def nli_training_examples(data: Path, skip: tuple[str, ...] = ()) -> list[Example]:
    """The NLI recipe's training examples (`RECIPES["nli"]["train"]` under the staged `data` folder,
    less the files in `skip`), without the held-out SNLI dev slice `disan train --recipe nli` selects
    on."""
    examples = []
    for rel in RECIPES["nli"]["train"]:
        if rel in skip:
            continue
        _, read = read_examples(data / rel)
        if rel == RECIPES["nli"]["holdout_from"]:
            read, _ = holdout_split(read, HOLDOUT_SIZE, HOLDOUT_SEED)
        examples += read
    return examples
