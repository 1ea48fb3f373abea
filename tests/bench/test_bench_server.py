"""bench/server.py's load generator: the wrk command it builds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import server


@pytest.mark.parametrize(("connections", "threads", "expected"), [(1, 4, 1), (2, 4, 2), (256, 4, 4)])
def test_wrk_never_gets_more_threads_than_connections(monkeypatch, tmp_path: Path, connections,
                                                      threads, expected):
    """wrk exits 1 when -t exceeds -c (bench/gpu.py's 1-client latency row died of it on the H100)."""
    calls: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        t = int(next(a for a in cmd if a.startswith("-t"))[2:])
        c = int(next(a for a in cmd if a.startswith("-c"))[2:])
        if t > c:  # what wrk itself does: "number of connections must be >= threads"
            raise subprocess.CalledProcessError(1, cmd)
        stats = {"requests": 10, "non2xx": 0, "seconds": 1.0, "p50_ms": 1.0, "p99_ms": 2.0}
        return subprocess.CompletedProcess(cmd, 0, stdout="WRKJSON " + json.dumps(stats) + "\n")

    monkeypatch.setattr(server.shutil, "which", lambda name: "/usr/bin/wrk")
    monkeypatch.setattr(server.subprocess, "run", fake_run)
    bodies = tmp_path / "bodies.jsonl"
    bodies.write_text(json.dumps({"texts": ["a"]}) + "\n")
    stats = server.load("http://127.0.0.1:1", bodies, connections, 1.0, 1, threads)
    assert f"-t{expected}" in calls[0] and f"-c{connections}" in calls[0]
    assert stats["sentences_per_s"] == 10.0
