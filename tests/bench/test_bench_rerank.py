"""bench/rerank.py stays runnable: both of its rows against a live `disan serve` on the tiny
bundle (one worker, a few rounds, a two-second stream: the probe starts after one).

Needs the tiny bundle (torch, onnx) and the service's dependencies; skips without.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("onnxruntime")

from bench import rerank  # noqa: E402 - after the skips: it imports the service's client kit


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "with-sparse"])
def test_cost_and_stream_rows_against_a_live_server(request, tmp_path, capsys, sparse):
    bundle = request.getfixturevalue("sparse_bundle" if sparse else "tiny_bundle")
    out = tmp_path / "rerank.json"
    code = rerank.main(["--bundle", str(bundle), "--workers", "1", "--passages", "5", "--rounds", "3",
                        "--seconds", "2", "--clients", "2", "--machine", "test", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    rows = {r["attack"]: r for r in result["rows"]}
    assert list(rows) == ["cost", "rerank+small"]
    # 5 rounds (2 to warm up) of /rerank and /embed, and of /embed_sparse and the hybrid /rerank where
    # the bundle serves sparse vectors
    assert rows["cost"]["statuses"] == {"200": 20 if sparse else 10} and rows["cost"]["probe_n"] == 3
    assert result["rerank_over_embed"] > 0 and "ratio" in rows["cost"]["note"]
    assert (result["sparse_over_embed"] is not None) == sparse == ("/embed_sparse" in rows["cost"]["note"])
    assert (result["hybrid_over_rerank"] is not None) == sparse == ("with hybrid" in rows["cost"]["note"])
    assert set(rows["rerank+small"]["statuses"]) == {"200"} and rows["rerank+small"]["probe_n"] > 0
    assert "| cost |" in capsys.readouterr().out
