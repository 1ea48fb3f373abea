"""bench/chaos.py stays runnable: a few of its attacks against a live `disan serve` on the tiny
bundle (one worker, one-second attacks), and what they must show on any bundle.

Needs the tiny bundle (torch, onnx) and the service's dependencies; skips without.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("onnxruntime")

from bench import chaos  # noqa: E402 - after the skips: it imports the service's client kit


def test_attacks_run_against_a_live_server(tiny_bundle, tmp_path, capsys):
    out = tmp_path / "chaos.json"
    code = chaos.main(["--bundle", str(tiny_bundle), "--workers", "1", "--seconds", "1",
                       "--only", "odd input", "headers", "metrics", "drain", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = {r["attack"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["headers", "metrics", "odd input", "drain"]  # the driver's order
    assert rows["odd input"]["note"] == "no 5xx"
    assert set(rows["odd input"]["statuses"]) <= {"200", "400", "413", "422"}
    assert set(rows["headers"]["statuses"]) == {"431"} and rows["headers"]["probe_n"] > 0
    went_back = re.findall(r"(disan_\w+) (\d+)", rows["metrics"]["note"].split("backwards:")[1])
    assert len(went_back) == 3 and all(n == "0" for _, n in went_back), rows["metrics"]["note"]
    # every request in flight at SIGTERM got a JSON answer (none cut off, none unanswered) and
    # the server exited: 0 from uvicorn's supervisor, -15 from one worker, which re-raises the
    # signal after its graceful shutdown (uvicorn >= 0.29, Kludex/uvicorn#1600)
    drained = rows["drain"]["note"]
    assert "text" not in drained and "err" not in drained, drained
    assert re.search(r"exit code (0|-15) after", drained), drained
    assert "| attack |" in capsys.readouterr().out
