"""bench/text_share.py: the tokenizer's and the graph's share of the offline encoder's time, bundles
in alternation, ratios to the first measured in the same run."""

from __future__ import annotations

import json

import pytest

from bench import text_share as bench

pytest.importorskip("onnxruntime")


def test_two_bundles_in_one_run(tiny_bundle, bench_sentences, tmp_path):
    out = tmp_path / "share.json"
    assert bench.main(["--bundles", str(tiny_bundle), str(tiny_bundle), "--data", str(bench_sentences),
                       "--lengths", "1-10", "--per-bucket", "8", "--rounds", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["sentences"] == 8 and report["rounds"] == 2
    rates = report["sentences_per_s"][str(tiny_bundle)]
    assert set(rates) == {"text", "graph", "both"} and all(v > 0 for v in rates.values())
    assert report["ratio_to_first"] == {}  # the same bundle twice is one entry: nothing to compare
