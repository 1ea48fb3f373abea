"""bench/gpu.py stays runnable: its --smoke mode runs every part on the CPU provider, tiny sizes.

Needs the tiny bundle and checkpoint (torch, onnx) and the staged SNLI test file; skips without.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu


@pytest.fixture(scope="module")
def snli_dir(tmp_path_factory) -> Path:
    """A tiny stand-in for the staged data: snli/test_tok.jsonl.gz with known words."""
    root = tmp_path_factory.mktemp("data")
    (root / "snli").mkdir()
    words = "a man is playing guitar the dog runs in park woman reading book".split()
    rows = [{"sentence1": " ".join(words[i % 7: i % 7 + 3 + i % 5]),
             "sentence2": " ".join(words[(i + 3) % 7: (i + 3) % 7 + 2 + i % 4]) + " ."}
            for i in range(40)]
    with gzip.open(root / "snli" / "test_tok.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return root


def test_smoke_runs_every_part_on_cpu(tiny_bundle, tiny_checkpoints, snli_dir, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    code = gpu.main(["--smoke", "--bundle", str(tiny_bundle), "--data", str(snli_dir), "--no-minilm",
                     "--checkpoint", str(tiny_checkpoints.nli), "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads(out.read_text())
    assert results["smoke"] and results["provider"] == gpu.CPU
    engines = {r["engine"] for r in results["offline"]["rows"]}
    # the bundle's graphs, the unchunked export (fp32 + fp16) and the PyTorch reference all ran
    assert {"ORT exported unchunked fp32", "ORT exported unchunked fp16", "PyTorch eager fp32"} <= engines
    assert all(r["sentences_per_s"] > 0 for r in results["offline"]["rows"])
    agreement = results["offline"]["agreement"]
    assert agreement["exported unchunked fp16: min cosine to exported unchunked fp32"] > 0.99
    # chunked (the bundle) and unchunked (exported here) attention give the same embeddings
    assert all(v < 1e-4 for k, v in agreement.items() if "max |diff|" in k)
    best = results["sweep"][gpu.CPU]["best"]
    assert best in results["sweep"][gpu.CPU]["points"]
    runs = results["service"]["runs"]
    # per-worker runtimes: 1 worker, then 2 (the shared inference process is gone, issue 82)
    assert [(r["workers"], r["texts_per_request"]) for r in runs] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert all(r["sentences_per_s"] > 0 and r["non2xx"] == 0 for r in runs)
    assert "| engine |" in capsys.readouterr().out
    lengths = results["lengths"]
    assert {r["budget"] for r in lengths["rows"]} == {"8/256", "32/4096"}
    assert {r["texts"] for r in lengths["rows"]} == set(lengths["tokens"])
    assert all(r["texts_per_s"] > 0 and r["tokens_per_s"] > 0 for r in lengths["rows"])


def test_without_cuda_it_stops_with_one_line(tiny_bundle, snli_dir, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    if gpu.CUDA in ort.get_available_providers():
        pytest.skip("this host has CUDA: the no-CUDA message cannot be shown here")
    r = subprocess.run([sys.executable, "-m", "bench.gpu", "--bundle", str(tiny_bundle), "--data",
                        str(snli_dir), "--json", str(tmp_path / "x.json")],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("bench.gpu: ") and "CUDA" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.json").exists()
