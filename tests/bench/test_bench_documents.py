"""bench.documents: windowed documents against MiniLM, one run (smoke: a tiny bundle, no MiniLM)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def _scifact(root: Path) -> Path:
    folder = root / "retrieval" / "scifact"
    folder.mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": f"title {i}", "text": "a dog is running in the park . " * (5 + 20 * i)}
            for i in range(4)]
    with gzip.open(folder / "corpus.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    with gzip.open(folder / "queries.jsonl.gz", "wt") as f:
        f.write(json.dumps({"_id": "q1", "text": "a dog"}) + "\n")
    with gzip.open(folder / "qrels.tsv.gz", "wt") as f:
        f.write("q1\td1\t1\n")
    return root


def test_each_bundle_is_timed_each_round_on_the_same_documents(tiny_bundle: Path, tmp_path: Path) -> None:
    from bench.documents import main

    out = tmp_path / "r.json"
    data = _scifact(tmp_path)
    assert main(["--bundle", str(tiny_bundle), "--bundle", str(tiny_bundle), "--data", str(data),
                 "--docs", "3", "--rounds", "2", "--threads", "1", "--no-minilm", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["docs"] == 3 and report["words_mean"] > 30
    assert [len(s) for s in report["seconds"].values()] == [2]  # one label per bundle path, 2 rounds
    assert all(s > 0 for s in report["seconds"][f"DiSAN ({tiny_bundle})"])
