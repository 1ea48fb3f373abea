"""How much of the staged dev text each tokenizer cannot read: the word table of a bundle
(`vocab.json`; a token it lacks reads as a hashed rare row, or UNK) against subword pieces
(all-mpnet-base-v2's WordPiece; a piece it lacks reads as [UNK]).

    python -m research.unknown_tokens --bundle models/default --data ../shared/data
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from disan.distill.teacher import teacher_tokenizer_file
from disan.text.pieces import PieceTokenizer
from disan.text.tokenizer import Vocab

SETS = {
    "sts-other": ("sts-other/dev.jsonl.gz", ("sentence1", "sentence2")),
    "stsb-dev": ("stsb/dev.jsonl.gz", ("sentence1", "sentence2")),
    "sick-dev": ("senteval/SICK/sick_dev.jsonl.gz", ("sentence_a", "sentence_b")),
    "scifact-corpus": ("retrieval/scifact/corpus.jsonl.gz", ("title", "text")),
    "scifact-queries": ("retrieval/scifact/queries.jsonl.gz", ("text",)),
    "cranfield-corpus": ("retrieval/cranfield/corpus.jsonl.gz", ("title", "text")),
    "cranfield-queries": ("retrieval/cranfield/queries.jsonl.gz", ("text",)),
}


def texts(data: Path, rel: str, fields: tuple[str, ...]) -> list[str]:
    with gzip.open(data / rel, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return [row[f] for row in rows for f in fields if row.get(f)]


def word_rate(vocab: Vocab, items: list[str]) -> tuple[int, int]:
    """(tokens, tokens the table lacks), after the compound splitting and spelling fixes."""
    total = unknown = 0
    for text in items:
        toks = vocab.tokens(text)
        total += len(toks)
        unknown += sum(t not in vocab.stoi for t in toks)
    return total, unknown


def piece_rate(tok: PieceTokenizer, items: list[str]) -> tuple[int, int]:
    ids = tok.batch_ids(items)
    return sum(map(len, ids)), sum(row.count(tok.unk_id) for row in ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--json", type=Path, default=Path("research/results/unknown_tokens.json"))
    args = parser.parse_args()
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    vocab = Vocab.load(args.bundle / manifest["vocab"])
    pieces = PieceTokenizer.from_file(teacher_tokenizer_file())
    rows = []
    print(f"{'set':18s} {'words':>9s} {'unknown':>8s} {'pieces':>9s} {'[UNK]':>8s}")
    for name, (rel, fields) in SETS.items():
        items = texts(args.data, rel, fields)
        w, wu = word_rate(vocab, items)
        p, pu = piece_rate(pieces, items)
        rows.append({"set": name, "words": w, "words_unknown": wu, "pieces": p, "pieces_unknown": pu})
        print(f"{name:18s} {w:9d} {wu / w:8.2%} {p:9d} {pu / p:8.2%}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"bundle": str(args.bundle), "sets": rows}, indent=1) + "\n")


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.unknown_tokens"))
