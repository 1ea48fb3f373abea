"""bench/text_share.py: the tokenizer's and the graph's share of the offline encoder's time, bundles
in alternation, ratios to the first measured in the same run."""

from __future__ import annotations

import gzip
import json

import pytest

from bench import text_share as bench
from disan.data.recipes import BENCH_SENTENCE_FILES

pytest.importorskip("onnxruntime")

WORDS = "the a man film good bad is was playing guitar".split()


@pytest.fixture
def data(tmp_path):
    for i, rel in enumerate(BENCH_SENTENCE_FILES):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            for j in range(12):
                words = [WORDS[(i + j + k) % len(WORDS)] for k in range(3 + j % 6)]
                f.write(json.dumps({"text": " ".join(words) + f" {i} {j}"}) + "\n")
    return tmp_path


def test_two_bundles_in_one_run(tiny_bundle, data, tmp_path):
    out = tmp_path / "share.json"
    assert bench.main(["--bundles", str(tiny_bundle), str(tiny_bundle), "--data", str(data), "--lengths",
                       "1-10", "--per-bucket", "8", "--rounds", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["sentences"] == 8 and report["rounds"] == 2
    rates = report["sentences_per_s"][str(tiny_bundle)]
    assert set(rates) == {"text", "graph", "both"} and all(v > 0 for v in rates.values())
    assert report["ratio_to_first"] == {}  # the same bundle twice is one entry: nothing to compare
