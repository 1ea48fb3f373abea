"""`disan serve` and Settings: flags mirror env variables, flags win, errors are one line, SIGTERM drains."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from support_serving import wait_ready

from bench.load import check_loopback, run_load
from service import cli
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_setting_has_a_flag_and_an_env_variable():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for name in Settings.model_fields:
        assert cli.flag_name(name) in flags
        assert cli.env_name(name) == "DISAN_" + name.upper()
    for stable in ("--bundle", "--host", "--port", "--providers", "--max-batch-size", "--max-wait-ms",
                   "--max-batch-cells", "--queue-limit", "--api-key", "--cors-origins", "--workers"):
        assert stable in flags


def test_flags_override_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DISAN_PORT", "9001")
    monkeypatch.setenv("DISAN_MAX_WAIT_MS", "7.5")
    monkeypatch.setenv("DISAN_CORS_ORIGINS", "https://a.example, https://b.example")
    s = cli.settings_from_args(parse("--port", "9002", "--bundle", str(tmp_path)))
    assert s.port == 9002 and s.max_wait_ms == 7.5 and s.bundle == tmp_path
    assert s.cors_origins == ["https://a.example", "https://b.example"]
    s = cli.settings_from_args(parse("--cors-origins", "https://c.example"))
    assert s.cors_origins == ["https://c.example"]


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no ./models/default here: falls back to the repo's
    for name in Settings.model_fields:
        monkeypatch.delenv(cli.env_name(name), raising=False)
    s = Settings()
    assert (s.host, s.port, s.providers) == ("127.0.0.1", 8000, "auto")
    assert s.bundle == REPO / "models" / "default"
    (tmp_path / "models" / "default").mkdir(parents=True)
    assert Settings().bundle == tmp_path / "models" / "default"


def test_invalid_settings_are_one_line_exit_2(capsys, tmp_path):
    assert cli.run(parse("--port", "70000")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "port" in err[0]
    assert cli.run(parse("--queue-limit", "1", "--max-texts-per-request", "5")) == 2
    assert "queue_limit" in capsys.readouterr().err


def test_missing_and_tampered_bundle(capsys, tmp_path, tiny_bundle):
    assert cli.run(parse("--bundle", str(tmp_path / "nothing"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and cli.EXPORT_HINT in err[0]
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_bundle.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "vocab.json").write_text('{"format": "disan-vocab", "itos": ["<pad>", "<unk>", "x"]}')
    assert cli.run(parse("--bundle", str(bad))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_server_serves_and_drains_on_sigterm(tiny_bundle):
    port = free_port()
    env = {**os.environ, "DISAN_MAX_WAIT_MS": "20", "DISAN_LOG_LEVEL": "info"}
    proc = subprocess.Popen([sys.executable, "-m", "disan.cli", "serve", "--bundle", str(tiny_bundle),
                             "--port", str(port)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda url: httpx.get(url, timeout=1), base, timeout=60,
                   alive=lambda: proc.poll() is None, retry=(httpx.TransportError,))
        info = httpx.get(f"{base}/info").json()
        assert info["provider"] == "CPUExecutionProvider"
        load = asyncio.run(run_load(base, "/embed", concurrency=4, requests=40, time_limit=30,
                                    texts_per_request=2))
        assert load.sent == load.ok == 40 and load.statuses == {"200": 40}
        assert 0 < load.p50_ms <= load.p95_ms <= load.p99_ms and load.sentences_per_s > 0
        statuses: list[int] = []

        def client() -> None:
            with httpx.Client(base_url=base, timeout=10) as c:
                for _ in range(5):
                    try:
                        r = c.post("/embed", json={"texts": ["a man is playing"] * 8})
                        statuses.append(r.status_code)
                    except httpx.TransportError:
                        statuses.append(-1)  # refused after shutdown began: fine, never a 5xx

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while not statuses:  # requests are flowing: now stop the server under load
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        # uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is a clean exit too.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        log = proc.stdout.read()
        assert "Application shutdown complete" in log and "batchers drained" in log, log
        assert 200 in statuses and all(s in (200, 503, -1) for s in statuses), statuses
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("workers", [1, 2])
def test_server_exits_when_the_bundle_cannot_load(tiny_bundle, workers):
    """A load that fails (here providers=cuda on CPU-only onnxruntime) ends `disan serve`, so a
    container stops instead of staying up unready; with workers, uvicorn's supervisor stops too."""
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu installed: providers=cuda may load here")
    proc = subprocess.run([sys.executable, "-m", "disan.cli", "serve", "--bundle", str(tiny_bundle),
                           "--port", str(free_port()), "--providers", "cuda", "--workers", str(workers)],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert "cannot load the bundle" in proc.stderr and "providers=cuda" in proc.stderr, proc.stderr
    # One worker: the process is the worker and exits with uvicorn's start-up failure status.
    # Several: the worker does, and the supervisor then stops (its own status is 0).
    assert proc.returncode == (3 if workers == 1 else 0), proc.stderr


def test_load_generator_refuses_remote_hosts():
    check_loopback("http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="127.0.0.1"):
        check_loopback("http://example.com:8000")


def test_empty_api_key_env_means_no_key(monkeypatch):
    """`DISAN_API_KEY=` (empty line in an .env file) must not lock every client out."""
    from service.settings import Settings

    monkeypatch.setenv("DISAN_API_KEY", "")
    assert Settings().api_key is None
    monkeypatch.setenv("DISAN_API_KEY", "k")
    assert Settings().api_key.get_secret_value() == "k"


def test_access_log_is_off_unless_asked(monkeypatch, tiny_bundle):
    """uvicorn's access log costs ~0.1 ms per request (bench/RESULTS.md): off by default."""
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: calls.append(kwargs))
    # run() exports its flags to DISAN_* for worker processes; setenv restores them afterwards.
    monkeypatch.setenv("DISAN_ACCESS_LOG", "false")
    monkeypatch.setenv("DISAN_BUNDLE", str(tiny_bundle))
    assert cli.run(parse()) == 0
    assert cli.run(parse("--access-log", "true")) == 0
    assert [c["access_log"] for c in calls] == [False, True]
    assert all(c["proxy_headers"] is False and c["factory"] for c in calls)


def test_serve_help_shows_every_default():
    """`disan serve --help` names each setting's default next to its env variable."""
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "(default: 0; env DISAN_MAX_BATCH_SIZE)" in text
    assert "(default: auto; env DISAN_PROVIDERS)" in text
    assert "(default: unset; env DISAN_API_KEY)" in text
