"""Files the tests write for the commands that read them: a fake staged SST-5, a corpus folder, a
corpus file with every awkward row `disan embed` must read its own way; and a stand-in for MiniLM /
MPNet's word vectors."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path


def write_fake_sst5(root: Path, words: list[str], sentences: int, more_phrases: int, longest: int) -> Path:
    """`root`/sst/ with SST-5's four files of random `words` (labels 0..4 in turn); the phrase file
    holds the sentences and `more_phrases` more. Returns `root`."""
    rng = random.Random(0)

    def rows(n: int) -> list[dict]:
        return [{"text": " ".join(rng.choice(words) for _ in range(rng.randint(1, longest))), "label": i % 5}
                for i in range(n)]

    def write(name: str, rows: list[dict]) -> None:
        path = root / "sst" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))

    train = rows(sentences)
    write("sst5_train.jsonl.gz", train)
    write("sst5_phrases_train.jsonl.gz", train + rows(more_phrases))
    write("sst5_dev.jsonl.gz", rows(10))
    write("sst5_test.jsonl.gz", rows(10))
    return root


def write_corpus_folder(folder: Path, sentences: list[str]) -> Path:
    """A `disan corpus` folder of `sentences` (sentences.txt and a corpus.json whose hash checks out)."""
    import hashlib
    import json

    body = "".join(s + "\n" for s in sentences).encode("utf-8")
    folder.mkdir(parents=True)
    (folder / "sentences.txt").write_bytes(body)
    info = {"sha256": hashlib.sha256(body).hexdigest(), "sources": []}
    (folder / "corpus.json").write_text(json.dumps(info))
    return folder


class FakeWordEncoder:
    """Stands in for MiniLM / MPNet in `disan.train.word_vectors.static_vectors`: 8-d vectors, seeded by
    the number of words (CI has neither model)."""

    def encode(self, words, **_):
        import numpy as np

        return np.random.default_rng(len(words)).normal(size=(len(words), 8)).astype(np.float32)


def write_awkward_corpus(path: Path, texts: list[str]) -> tuple[list[str], list[str | None]]:
    """`texts` as the JSONL, CSV or TXT file `path` names (by its suffix), with what `disan embed`
    reads its own way: blank and whitespace-only lines (no rows), CRLF and LF endings, a raw U+2028
    inside a text (`str.splitlines` breaks there, `disan embed` does not), and unreadable rows (not
    UTF-8; not JSON, not an object, a null; a CSV record with a field too many), in a multi-line
    quoted CSV field, CSV ids that look like integers (`007`, read as strings). Returns the flags
    that read it and the rows as read (a row's text, None where it is unreadable): row numbers are
    positions in that list. JSONL and TXT ids are row numbers; CSV's are `--id-column key`."""
    import json

    fmt, out, rows = path.suffix.lstrip("."), bytearray(), []
    if fmt == "csv":
        out += b"key,text\r\n"
    for i, text in enumerate(texts):
        text = text + ("\u2028the dog" if i % 7 == 1 else "")
        end = b"\r\n" if i % 5 == 0 else b"\n"
        row: str | None = text
        if fmt == "jsonl":
            if i % 11 == 3:
                line, row = b"{not json", None
            elif i % 13 == 5:
                line, row = b'{"text": null}', None
            elif i % 17 == 7:
                line, row = json.dumps(text).encode(), None  # a JSON string, not an object
            elif i % 19 == 11:
                line, row = b'{"text": "caf\xe9"}', None
            else:
                line = json.dumps({"text": text, "n": i}, ensure_ascii=False).encode()
        elif fmt == "csv":
            if i % 9 == 4:
                text = row = text + "\nsecond line, \"quoted\""
            line = f'{i:03d},"{text.replace(chr(34), chr(34) * 2)}"'.encode()
            if i % 10 == 6:
                line, row = line + b",extra", None
            elif i % 19 == 11:
                line, row = line[:-1] + b' caf\xe9"', None
        else:
            line = f"  {text}\t".encode() if i % 8 == 2 else text.encode()
            if i % 19 == 11:
                line, row = b"caf\xe9", None
        out += line + end + (b"\n  \n" if i % 6 == 2 and fmt != "csv" else b"")
        rows.append(row)
    path.write_bytes(bytes(out))
    flags = ["--column", "text"] + (["--id-column", "key"] if fmt == "csv" else [])
    return flags, rows


SENTEVAL_WORDS = ["good", "bad", "fine", "awful", "what", "who", "where", "cat", "dog", "runs"]


def write_senteval_tree(root: Path) -> Path:
    """A tiny `senteval/` tree in the staged layout: MR, CR, SUBJ, MPQA (60 texts each, the label in
    the first word), TREC (60 train, 30 test: the question word), SICK (60 train, 30 dev pairs)."""
    rng = random.Random(0)

    def write(path: Path, rows: list[dict]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)

    def text(signal: str) -> str:
        return " ".join([signal] + [rng.choice(SENTEVAL_WORDS[7:]) for _ in range(3)])

    for name in ("MR/mr", "CR/cr", "SUBJ/subj", "MPQA/mpqa"):
        write(root / f"{name}.jsonl.gz", [{"text": text("good" if i % 2 else "bad"), "label": i % 2}
                                          for i in range(60)])
    for split, n in (("train", 60), ("test", 30)):
        write(root / f"TREC/trec_{split}.jsonl.gz",
              [{"text": text(["what", "who", "where"][i % 3]), "label": ["DESC", "HUM", "LOC"][i % 3]}
               for i in range(n)])
    labels = ["entailment", "neutral", "contradiction"]
    for split, n in (("train", 60), ("dev", 30)):
        write(root / f"SICK/sick_{split}.jsonl.gz",
              [{"sentence_a": text("fine"), "sentence_b": text(["fine", "dog", "awful"][i % 3]),
                "relatedness": [5.0, 3.0, 1.0][i % 3], "entailment": labels[i % 3]} for i in range(n)])
    return root
