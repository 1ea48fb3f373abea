"""The distillation corpus (`disan corpus`, TORCH-FREE): deduplicated English sentences, no eval text.

Paragraphs from each source (`disan.corpus_sources`) are split into sentences, filtered by length
and by how much of them is words, deduplicated on their tokens (`disan.text.tokenizer.tokenize`) and
checked against every evaluation text by the same key, so a sentence that differs from a test
sentence only in case or spacing is dropped too. The result is shuffled with a fixed seed, so any
prefix is a sample of the whole: a teacher cache that is only partly encoded still trains a student
on every source.

Output folder: `sentences.txt` (one sentence per line) and `corpus.json` (sources with origin,
licence and counts, the number of evaluation sentences dropped, the sentences file's sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from disan.corpus_sources import SOURCES, Source, fetch_debian, fetch_git, fetch_npm
from disan.data.readers import holdout_split, read_examples, read_jsonl
from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, RECIPES
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
]

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
    _, dev = read_examples(data / RECIPES["nli"]["holdout_from"])
    _, held = holdout_split(dev, HOLDOUT_SIZE, HOLDOUT_SEED)
    keys.update(" ".join(t) for ex in held for t in ex.texts)
    keys.discard("")
    return keys


def sentences_of(source: Source, root: Path, min_tokens: int, max_tokens: int) -> Iterator[str]:
    for paragraph in source.read(root):
        for sentence in split_sentences(paragraph):
            if keep(sentence, min_tokens, max_tokens):
                yield sentence


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


def build(sources: Iterable[Source], data: Path, debian_root: Path | None, out: Path,
          min_tokens: int = 4, max_tokens: int = 48, seed: int = 0, npm_dir: Path | None = None,
          git_dir: Path | None = None) -> dict:
    """Build the corpus into `out`; return its description (also written as corpus.json)."""
    excluded = eval_keys(data)
    seen: set[str] = set()
    kept: list[str] = []
    report = []
    for source in sources:
        root = _root(source, data, debian_root, npm_dir, git_dir)
        counts = {"read": 0, "duplicates": 0, "eval_dropped": 0, "kept": 0}
        for sentence in sentences_of(source, root, min_tokens, max_tokens):
            counts["read"] += 1
            k = key(sentence)
            if k in excluded:
                counts["eval_dropped"] += 1
            elif k in seen:
                counts["duplicates"] += 1
            else:
                seen.add(k)
                kept.append(sentence)
                counts["kept"] += 1
        report.append({"name": source.name, "origin": source.origin, "licence": source.licence, **counts})
        print(f"{source.name:20s} {counts}")
    order = np.random.default_rng(seed).permutation(len(kept))
    out.mkdir(parents=True, exist_ok=True)
    body = "".join(kept[i] + "\n" for i in order).encode("utf-8")
    (out / "sentences.txt").write_bytes(body)
    info = {"sentences": len(kept), "sha256": hashlib.sha256(body).hexdigest(), "seed": seed,
            "min_tokens": min_tokens, "max_tokens": max_tokens, "eval_sentences_checked": len(excluded),
            "eval_dropped": sum(s["eval_dropped"] for s in report), "sources": report}
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


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
