"""The shared inference process (`inference_process=shared`): service.backend.wire, service.backend.remote,
service.backend.inference_process and `disan serve --inference-process shared`.

The inference process runs as a real subprocess on the tiny bundle; the HTTP side is the real app
(TestClient) pointed at its socket, or a real `disan serve` with 2 workers.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.backend import wire
from service.backend.inference_process import InferenceServer, start, stop
from service.backend.remote import InferenceClient, RemoteBatcher, RemoteInferenceError
from service.common import batching_defaults
from service.common.batching_defaults import resolve_inference_process
from service.common.errors import InferenceError, NotReady, Overloaded
from service.main import create_app
from service.settings import Settings
from tests.conftest import block_runner, wait_ready

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["a man is playing a guitar .", "the dog runs in the park", "good movie",
         "a woman is reading a book ."]
PAIRS = [{"premise": "a man is playing a guitar .", "hypothesis": "a man is sleeping ."},
         {"premise": "the dog runs", "hypothesis": "a dog is running in the park"}]


def _env(bundle: Path, **settings: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISAN_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(DISAN_BUNDLE=str(bundle), DISAN_LOG_LEVEL="warning", DISAN_WORKERS="2",
               PYTHONPATH=str(ROOT), **{f"DISAN_{k.upper()}": str(v) for k, v in settings.items()})
    return env


class Inference:
    """A running inference process and its socket."""

    def __init__(self, bundle: Path, tmp: Path, **settings: object):
        self.socket = str(tmp / "inference.sock")
        self.proc = start(self.socket, _env(bundle, **settings))
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, "the inference process exited"
            assert time.monotonic() < deadline, "the inference process did not listen in 60 s"
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            stop(self.proc, 10)


@pytest.fixture(scope="module")
def inference(tiny_bundle, tmp_path_factory):
    proc = Inference(tiny_bundle, tmp_path_factory.mktemp("inference"))
    yield proc
    proc.close()


def shared_app(bundle: Path, socket_path: str, **overrides) -> TestClient:
    settings = Settings(bundle=bundle, workers=2, inference_process="shared", **overrides)
    return TestClient(create_app(settings, socket_path))


# ---------------------------------------------------------------- the frames
def test_frames_round_trip_payloads_and_results():
    rows = [[5, 6, 7], [1], list(range(100))]
    buf = memoryview(wire.request(7, wire.RUN, "encoder", rows))[4:]
    assert wire.parse_request(buf) == (7, wire.RUN, "encoder", rows)
    u, v = np.random.rand(3, 6).astype(np.float32), np.random.rand(3, 6).astype(np.float32)
    for pairs in ([(u[i], v[i]) for i in range(3)], [(u, v), (u[:1], v[:1])]):  # vectors; explained rows
        _, _, _, got = wire.parse_request(memoryview(wire.request(1, wire.RUN, "nli_head", pairs))[4:])
        for (a, b), (c, d) in zip(pairs, got, strict=True):
            assert np.array_equal(a, c) and np.array_equal(b, d)
    for results in ([u[0], u[1]], [u, u[:2]], [{"embedding": u[0], "s2t": u[1][:2]},
                                               {"embedding": u[2], "s2t": u[1][:5]}]):
        got, times = wire.parse_run_reply(memoryview(wire.reply_ok(3, results, (0.5, 0.25, 1.0, 2.0)))[4:])
        assert times == (0.5, 0.25, 1.0, 2.0)
        for a, b in zip(results, got, strict=True):
            pairs = a.items() if isinstance(a, dict) else [(None, a)]
            for key, value in pairs:
                assert np.array_equal(value, b[key] if key else b)
    head = memoryview(wire.reply_error(9, wire.OVERLOADED, "busy", 3))[4:]
    assert wire.parse_reply_head(head) == (9, wire.ERROR)
    assert wire.parse_error(head) == (wire.OVERLOADED, 3, "busy")


# ---------------------------------------------------------------- same answers as in-process
def test_shared_answers_like_the_in_process_engine(tiny_bundle, inference):
    local = TestClient(create_app(Settings(bundle=tiny_bundle, inference_process="off")))
    remote = shared_app(tiny_bundle, inference.socket)
    with local, remote:
        wait_ready(local.get)
        wait_ready(remote.get)
        info = remote.get("/info").json()["inference_process"]
        assert info == {"mode": "shared", "source": "set explicitly", "pid": inference.proc.pid}
        assert local.get("/info").json()["inference_process"]["mode"] == "off"
        calls = [("/embed", {"texts": TEXTS, "normalize": True}),
                 ("/embed", {"texts": TEXTS, "explain": True}),
                 ("/embed", {"texts": TEXTS, "encoding_format": "base64"}),
                 ("/nli", {"pairs": PAIRS}), ("/nli", {"pairs": PAIRS, "explain": True}),
                 ("/sentiment", {"texts": TEXTS}), ("/sentiment", {"texts": TEXTS, "explain": True}),
                 ("/similarity", {"texts": TEXTS}), ("/v1/embeddings", {"input": TEXTS})]
        for path, body in calls:
            a, b = local.post(path, json=body), remote.post(path, json=body)
            assert a.status_code == b.status_code == 200, (path, b.text)
            assert_close(a.json(), b.json(), path)
            assert float(b.headers["x-inference-time"]) > 0 and "x-queue-time" in b.headers
        # the routes' checks still run in the worker
        assert remote.post("/embed", json={"texts": []}).status_code == 422


def assert_close(a, b, where: str) -> None:
    """Same JSON; floats within 1e-5 (the two processes run the same graphs on the same calls)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert abs(a - b) <= 1e-5, (where, a, b)
    elif isinstance(a, str) and where.endswith("embedding") and a != b:  # base64 float32
        x, y = (np.frombuffer(base64.b64decode(s), np.float32) for s in (a, b))
        assert np.allclose(x, y, atol=1e-5), where
    else:
        assert a == b, where


# ---------------------------------------------------------------- batches fill across workers
def test_one_call_holds_sentences_from_several_workers(tiny_bundle, tmp_path):
    # The batcher waits up to 300 ms to fill: two workers' one-sentence requests must meet in one call.
    proc = Inference(tiny_bundle, tmp_path, max_wait_ms=300)

    async def scenario() -> dict:
        a = await InferenceClient.connect(proc.socket, 10)
        b = await InferenceClient.connect(proc.socket, 10)
        out = await asyncio.gather(*(c.run("encoder", [[5, 6, 7]], None) for c in (a, b, a, b)))
        assert all(np.array_equal(out[0][0], o[0]) for o in out)
        stats = await a.stats()
        await a.close()
        await b.close()
        return stats

    try:
        stats = asyncio.run(scenario())
    finally:
        proc.close()
    encoder = stats["encoder"]
    # warm-up runs no batcher: these are the four requests, in one call (or at worst two)
    assert encoder["sentences"] == 4 and encoder["largest"] >= 3, encoder


# ---------------------------------------------------------------- errors
def test_errors_cross_the_socket_and_the_process_survives(inference):
    async def scenario() -> None:
        client = await InferenceClient.connect(inference.socket, 10)
        with pytest.raises(RemoteInferenceError, match="encoder|Gather|index|indices"):
            # a negative id out of the table's range: ORT's Gather fails (an id past the vocabulary
            # no longer does: it reads as UNK, disan.model)
            await client.run("encoder", [[-10**7]], None)
        with pytest.raises(NotReady, match="no nope graph"):
            await client.run("nope", [[1]], None)
        assert len(await client.run("encoder", [[5]], None)) == 1  # still serving
        # this worker's queue bound holds before anything is sent
        small = RemoteBatcher(client, "encoder", queue_limit=2)
        with pytest.raises(Overloaded):
            await small.run([[1], [2], [3]])
        await client.close()

    asyncio.run(scenario())


def test_a_caller_that_leaves_is_withdrawn_from_the_inference_process(tiny_bundle, tmp_path):
    """A worker's request cancelled while queued (its client went away) is withdrawn from the
    shared batcher and never run: the inference process was told (before: it ran it for nobody)."""
    async def scenario() -> None:
        server = InferenceServer(Settings(bundle=tiny_bundle, batch_concurrency=1, max_wait_ms=0),
                                 str(tmp_path / "inference.sock"))
        await server.start()
        batcher = server.batchers["encoder"]
        gate, entered = block_runner(batcher)
        runs: list[list] = []
        blocked = batcher.runner
        batcher.runner = lambda rows: runs.append(rows) or blocked(rows)
        client = await InferenceClient.connect(server.socket_path, 10)
        try:
            first = asyncio.create_task(client.run("encoder", [[5, 6]], None))
            assert await asyncio.to_thread(entered.wait, 10)  # the one ORT slot is busy
            leaving = asyncio.create_task(client.run("encoder", [[7]] * 3, None))
            deadline = time.monotonic() + 10
            while batcher.depth < 3:
                assert time.monotonic() < deadline, "the second request never queued"
                await asyncio.sleep(0.01)
            leaving.cancel()
            while batcher.depth:
                assert time.monotonic() < deadline, "the cancelled request's items stayed queued"
                await asyncio.sleep(0.01)
            gate.set()
            assert len(await first) == 1
            assert all(len(rows) != 3 and [7] not in rows for rows in runs), runs
        finally:
            gate.set()
            await client.close()
            await server.stop()

    asyncio.run(scenario())


def test_inference_failure_is_a_500_json(tiny_bundle, inference):
    with shared_app(tiny_bundle, inference.socket) as client:
        wait_ready(client.get)
        engine = client.app.state.engine

        async def bad() -> None:
            with pytest.raises(InferenceError, match="RemoteInferenceError"):
                await engine._run("encoder", [[-10**7]])  # out of the table's range: ORT fails
        client.portal.call(bad)
        assert client.post("/embed", json={"texts": TEXTS}).status_code == 200


def test_a_killed_inference_process_is_a_503_not_a_hang(tiny_bundle, tmp_path):
    proc = Inference(tiny_bundle, tmp_path, max_wait_ms=1000)  # a request waits in its batcher
    with shared_app(tiny_bundle, proc.socket) as client:
        wait_ready(client.get)
        got: dict = {}
        waiting = threading.Thread(target=lambda: got.update(r=client.post("/embed", json={"texts": TEXTS})))
        waiting.start()
        time.sleep(0.3)
        proc.proc.kill()
        t0 = time.monotonic()
        waiting.join(10)
        assert not waiting.is_alive() and time.monotonic() - t0 < 5
        assert got["r"].status_code == 503 and got["r"].json()["error"]["type"] == "not_ready"
        after = client.post("/embed", json={"texts": TEXTS})
        assert after.status_code == 503 and after.json()["error"]["type"] == "not_ready"
        assert client.get("/ready").status_code == 503 and client.get("/health").status_code == 503
    proc.close()


# ---------------------------------------------------------------- auto
def test_auto_resolves_per_provider(monkeypatch):
    cpu, cuda = batching_defaults.CPU, batching_defaults.CUDA
    monkeypatch.setattr(batching_defaults, "requested_providers", lambda choice: [cuda, cpu])
    mode, why = resolve_inference_process("auto", 8, "auto")
    assert (mode, why) == ("off", "auto: " + batching_defaults.INFERENCE_PROCESS_DEFAULTS[cuda][1])
    assert "CUDA" in why and "measured" in why and "not yet" not in why
    monkeypatch.setattr(batching_defaults, "requested_providers", lambda choice: [cpu])
    mode, why = resolve_inference_process("auto", 2, "auto")
    assert mode == batching_defaults.INFERENCE_PROCESS_DEFAULTS[cpu][0] and why.startswith("auto: CPU")
    assert resolve_inference_process("auto", 1, "auto")[0] == "off"  # one worker: nothing to share
    assert resolve_inference_process("auto", 2, "auto", can_share=False)[0] == "off"
    assert resolve_inference_process("shared", 2, "auto") == ("shared", "set explicitly")
    assert resolve_inference_process("off", 2, "auto") == ("off", "set explicitly")


def test_shared_without_an_inference_process_fails_loudly(tiny_bundle):
    with TestClient(create_app(Settings(bundle=tiny_bundle, workers=2, inference_process="shared"))) as c:
        deadline = time.monotonic() + 30
        while c.get("/ready").json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.get("/health").status_code == 503


# ---------------------------------------------------------------- disan serve
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _serve(bundle: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """`disan serve --workers 2 --inference-process shared`, ready: (process, base URL); killed
    on the way out if the test left it running."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "disan.cli", "serve", "--port", str(port),
                               "--workers", "2", "--inference-process", "shared", "--drain-timeout-s", "3"],
                              env=_env(bundle), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(lambda url: httpx.get(url, timeout=2), base, timeout=90,
                   alive=lambda: server.poll() is None, retry=(httpx.TransportError,))
        yield server, base
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_disan_serve_shared_serves_drains_and_exits_when_inference_dies(tiny_bundle):
    with _serve(tiny_bundle) as (server, base):
        info = httpx.get(base + "/info").json()["inference_process"]
        assert info["mode"] == "shared"
        # both workers (fresh connections land on either) answer through the one process
        for _ in range(6):
            r = httpx.post(base + "/embed", json={"texts": TEXTS})
            assert r.status_code == 200 and len(r.json()["embeddings"]) == len(TEXTS)
        # the inference process's batches are in the workers' /metrics
        metrics = httpx.get(base + "/metrics").text
        assert 'disan_batch_size_count{graph="encoder"}' in metrics
        os.kill(info["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        # until the workers are gone: 503 JSON, never a hang
        while server.poll() is None and time.monotonic() - t0 < 15:
            try:
                r = httpx.post(base + "/embed", json={"texts": TEXTS}, timeout=5)
                assert r.status_code == 503 and r.json()["error"]["type"] == "not_ready"
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        code = server.wait(15)
        assert code != 0 and "inference process exited" in server.stderr.read().decode()


def test_disan_serve_shared_sigterm_stops_everything(tiny_bundle):
    with _serve(tiny_bundle) as (server, base):
        pid = httpx.get(base + "/info").json()["inference_process"]["pid"]
        server.send_signal(signal.SIGTERM)
        assert server.wait(3 + 5) == 0  # within the shutdown deadline (drain 3 s + 5)
        deadline = time.monotonic() + 2
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the inference process outlived disan serve"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def test_settings_flag_and_env(monkeypatch):
    monkeypatch.setenv("DISAN_INFERENCE_PROCESS", "shared")
    assert Settings().inference_process == "shared"
    out = subprocess.run([sys.executable, "-m", "disan.cli", "serve", "--help"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert "--inference-process" in out
