"""The images and compose files run for real (podman + runc), not only linted.

Driven by docker/ci-containers.sh, which installs podman, bootstraps the Debian base images,
builds the service and load-balancer images and sets DISAN_CONTAINERS_LIVE=1; without it every
test here skips. What runs, all on 127.0.0.1:

- `disan-cpu` from docker-compose.yml as written (bundle volume, read-only root, tmpfs, dropped
  capabilities, no-new-privileges, healthcheck): /ready, one request per route the live service
  lists in its OpenAPI schema, the user id, the healthcheck, and SIGTERM draining requests in
  flight within the compose `stop_grace_period`;
- docker-compose.scale.yml: 2 replicas behind the Debian-built nginx, requests spread over both,
  one replica killed under load with no failed requests beyond those it had in flight;
- the GPU image built on the Debian base (no CUDA): DISAN_PROVIDERS=auto serves on the CPU,
  DISAN_PROVIDERS=cuda refuses to start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
yaml = pytest.importorskip("yaml")

if os.environ.get("DISAN_CONTAINERS_LIVE") != "1":
    pytest.skip("live container tests run from docker/ci-containers.sh (needs podman)",
                allow_module_level=True)
if shutil.which("podman") is None or shutil.which("podman-compose") is None:
    pytest.fail("DISAN_CONTAINERS_LIVE=1 but podman / podman-compose are not on PATH")

from support_containers import (  # noqa: E402  (after the skips: it needs podman's tools)
    COMPOSE,
    CPU_IMAGE,
    GPU_IMAGE,
    LB_IMAGE,
    LONG_TEXT,
    READY_TIMEOUT_S,
    ROOT,
    SCALE,
    SERVICE_UID,
    Project,
    compose_service,
    example_bodies,
    free_port,
    in_container,
    inspect,
    logs,
    podman,
    seconds,
    wait_ready,
)


# ------------------------------------------------------------------------ disan-cpu, compose
@pytest.fixture(scope="module")
def cpu_service() -> Iterator[tuple[Project, str, str]]:
    port = free_port()
    project = Project("disan-ci-cpu", (COMPOSE,), {"HOST_PORT": str(port)})
    project.down()  # leftovers of an interrupted run
    try:
        project.compose("up", "-d", "disan-cpu")
        (container,) = project.containers("disan-cpu")
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, container)
        yield project, container, url
    finally:
        project.down()


def test_cpu_service_is_ready_and_says_what_it_runs(cpu_service) -> None:
    _, _, url = cpu_service
    assert httpx.get(f"{url}/ready").json() == {"status": "ready"}
    info = httpx.get(f"{url}/info").json()
    assert info["provider"] == "CPUExecutionProvider" and info["dim"] > 0


def test_every_route_answers(cpu_service) -> None:
    """One request per route the live service publishes: a new route without a check here fails."""
    _, _, url = cpu_service
    spec = httpx.get(f"{url}/openapi.json").json()
    info = httpx.get(f"{url}/info").json()
    dim = info["dim"]
    # path parameters the API has, filled with values the live server serves
    params = {"{model}": info["model"]}
    answered = set()
    with httpx.Client(base_url=url, timeout=30) as client:
        for path, operations in spec["paths"].items():
            concrete = path
            for name, value in params.items():
                concrete = concrete.replace(name, value)
            assert "{" not in concrete, f"{path}: a path parameter this test does not fill yet"
            for method, operation in operations.items():
                for body in example_bodies(spec, operation) if "requestBody" in operation else [None]:
                    response = client.request(method.upper(), concrete, json=body)
                    assert response.status_code == 200, (method, path, body, response.text[:500])
                    if path == "/metrics":
                        assert "disan_requests_total" in response.text
                    else:  # ours answer an object; TEI's bodies a list where TEI does
                        assert isinstance(response.json(), dict | list), (method, path)
                    if path == "/embed" and "texts" in body:
                        vectors = response.json()["embeddings"]
                        assert len(vectors) == len(body["texts"]) and len(vectors[0]) == dim
                    answered.add((method.upper(), path))
    assert {("POST", "/embed"), ("POST", "/nli"), ("POST", "/sentiment"),
            ("GET", "/ready"), ("GET", "/info")} <= answered, answered


def test_runs_as_compose_hardens_it(cpu_service) -> None:
    """uid 10001 everywhere, no capabilities, no-new-privileges, read-only root and bundle,
    /tmp writable, and the healthcheck compose declares passes."""
    _, container, _ = cpu_service
    service = compose_service("disan-cpu")
    report = json.loads(in_container(container, """
import json, os, pathlib
procs = {}
for p in pathlib.Path("/proc").iterdir():
    if p.name.isdigit():
        try:
            status = dict(l.split(":", 1) for l in (p / "status").read_text().splitlines() if ":" in l)
        except OSError:
            continue
        procs[p.name] = {k: status[k].split()[0] for k in ("Uid", "CapEff", "NoNewPrivs")}
writable = {}
for d in ("/", "/app", "/app/models/default", "/tmp"):
    try:
        open(os.path.join(d, ".probe"), "w").close(); os.remove(os.path.join(d, ".probe"))
        writable[d] = True
    except OSError:
        writable[d] = False
print(json.dumps({"procs": procs, "writable": writable}))
"""))
    assert report["procs"], report
    for pid, status in report["procs"].items():
        assert status == {"Uid": str(SERVICE_UID), "CapEff": "0000000000000000", "NoNewPrivs": "1"}, pid
    assert report["writable"] == {"/": False, "/app": False, "/app/models/default": False, "/tmp": True}
    details = inspect(container)
    assert details["HostConfig"]["ReadonlyRootfs"] is True
    mounts = {m["Destination"]: m for m in details["Mounts"]}
    bundle = mounts["/app/models/default"]
    assert bundle["RW"] is False and Path(bundle["Source"]) == ROOT / "models" / "default"
    assert details["Config"]["Healthcheck"]["Test"] == service["healthcheck"]["test"]
    health = podman("healthcheck", "run", container, check=False)
    assert health.returncode == 0, health.stdout + health.stderr


def test_sigterm_drains_within_the_grace_period(cpu_service) -> None:
    """Requests in flight when the container is stopped complete (200); it exits on its own.

    Admission control may hold the second request (its body unread) while the first one's work
    is estimated at more than DISAN_MAX_QUEUE_WAIT_S, and refuse it with 429 and Retry-After
    when that lasts past DISAN_ADMISSION_WAIT_S: on a slow CPU it does. That request never
    started, so it is not one to drain; a 429 is its right answer, and anything else (an error,
    a reset connection) fails the test as before."""
    project, container, url = cpu_service
    grace = seconds(compose_service("disan-cpu")["stop_grace_period"])
    results: list[tuple[float, int | str]] = []  # (end time, status or error)

    def heavy() -> None:
        with httpx.Client(timeout=grace) as client:
            try:
                # The most texts a request may carry, each windowed (4 windows): 256 single-window
                # texts were answered within the 0.5 s below on a quiet 2-core machine.
                r = client.post(f"{url}/embed", json={"texts": [" ".join([LONG_TEXT] * 4)] * 256})
                results.append((time.monotonic(), r.status_code))
            except httpx.HTTPError as exc:
                results.append((time.monotonic(), type(exc).__name__))

    threads = [threading.Thread(target=heavy) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # sent and accepted
    assert not results, f"requests finished before SIGTERM, nothing to drain: {results}"
    stop_sent = time.monotonic()
    project.compose("stop", "disan-cpu", timeout=grace + 30)
    stop_s = time.monotonic() - stop_sent
    for t in threads:
        t.join(grace)
    state, log = inspect(container)["State"], logs(container)
    assert len(results) == 2 and all(status in (200, 429) for _, status in results), results
    drained = [end for end, status in results if status == 200]
    assert drained and max(drained) > stop_sent, f"no request was still in flight at SIGTERM: {results}"
    assert state["ExitCode"] == 0 and stop_s < grace, (state, stop_s, log[-2000:])
    assert "batchers drained" in log, log[-2000:]
    print(f"\nstop with {len(drained)} of 2 x 256-text requests admitted and drained: {stop_s:.1f} s "
          f"(grace {grace:.0f} s)")


# --------------------------------------------------------------------- scale-out, compose
@pytest.fixture(scope="module")
def scaled() -> Iterator[tuple[Project, str, list[str]]]:
    port = free_port()
    # One worker per replica: 2 replicas x 1 worker fill 2 cores, and each replica's /metrics then
    # counts every request it served (workers keep separate counters).
    project = Project("disan-ci-scale", (COMPOSE, SCALE), {
        "HOST_PORT": str(port), "REPLICAS": "2", "LB_IMAGE": LB_IMAGE, "DISAN_WORKERS": "1"})
    project.down()
    try:
        project.compose("up", "-d", "disan-cpu", "lb")
        replicas = project.containers("disan-cpu")
        assert len(replicas) == 2, replicas
        for replica in replicas:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while podman("exec", replica, "python", "/app/healthcheck.py", check=False).returncode:
                assert time.monotonic() < deadline, logs(replica)[-3000:]
                time.sleep(0.5)
        url = f"http://127.0.0.1:{port}"
        (lb,) = project.containers("lb")
        wait_ready(url, lb)
        yield project, url, replicas
    finally:
        project.down()


def embed_count(replica: str) -> float:
    """POST /embed answered 200 by this replica, from its own /metrics."""
    text = in_container(replica, "import urllib.request; print(urllib.request.urlopen("
                                 "'http://127.0.0.1:8000/metrics', timeout=5).read().decode())")
    m = re.search(r'^disan_requests_total\{method="POST",route="/embed",status="200"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_balancer_spreads_requests_over_both_replicas(scaled) -> None:
    _, url, replicas = scaled
    before = [embed_count(r) for r in replicas]
    with httpx.Client(base_url=url, timeout=30) as client, ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda i: client.post("/embed", json={"texts": [f"sentence {i}"]})
                                 .status_code, range(40)))
    assert statuses == [200] * 40
    served = [embed_count(r) - b for r, b in zip(replicas, before, strict=True)]
    assert sum(served) == 40 and min(served) > 0, dict(zip(replicas, served, strict=True))
    print(f"\n40 requests through nginx: {dict(zip(replicas, served, strict=True))}")


def test_killing_a_replica_fails_at_most_the_requests_in_flight(scaled) -> None:
    project, url, replicas = scaled
    clients, victim = 4, replicas[-1]
    outcomes: list[tuple[float, int | str]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                try:
                    status: int | str = c.post("/embed", json={"texts": ["a man plays a guitar"] * 4}) \
                        .status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                outcomes.append((time.monotonic(), status))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2)
    killed_at = time.monotonic()
    podman("kill", "--signal", "KILL", victim)
    time.sleep(4)
    stop.set()
    for t in threads:
        t.join(40)
    before = [s for t, s in outcomes if t < killed_at]
    after = [s for t, s in outcomes if t >= killed_at]
    failed = [s for s in after if s != 200]
    assert before and set(before) == {200}, before
    # Each client has one request at a time: at most `clients` were in flight on the victim.
    assert len(failed) <= clients, failed
    assert len(after) - len(failed) >= 10 and after[-clients:] == [200] * clients, after
    print(f"\nkill -9 of {victim} under load: {len(after)} requests after it, {len(failed)} failed")


# -------------------------------------------------------------------------------- traces
# An OTLP/HTTP endpoint that records the paths posted to it, run inside the service's container.
OTLP_SINK = """
import http.server
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        with open("/tmp/otlp-posts", "a") as out:
            out.write(self.path + "\\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", 4318), Sink).serve_forever()
"""


def test_cpu_image_sends_traces_where_otel_says() -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT (what an OpenTelemetry operator sets) turns tracing on: the image
    starts, serves, and posts its spans there (it exited at start before it had the extra)."""
    name, port = "disan-ci-cpu-traces", free_port()
    podman("rm", "-f", name, check=False)
    try:
        podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "--read-only",
               "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "-e", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "-e", "OTEL_BSP_SCHEDULE_DELAY=100",
               CPU_IMAGE)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, name)
        podman("exec", "-d", name, "python", "-c", OTLP_SINK)
        posts = ""
        deadline = time.monotonic() + 60
        while "/v1/traces" not in posts and time.monotonic() < deadline:
            r = httpx.post(f"{url}/embed", json={"texts": ["A man is playing a guitar."]}, timeout=30)
            assert r.status_code == 200, r.text
            time.sleep(0.5)
            posts = podman("exec", name, "cat", "/tmp/otlp-posts", check=False).stdout
        assert "/v1/traces" in posts, logs(name)[-3000:]
    finally:
        podman("rm", "-f", name, check=False)


# ------------------------------------------------------------- GPU image without a GPU
def test_gpu_image_falls_back_to_cpu_with_auto() -> None:
    name, port = "disan-ci-gpu-auto", free_port()
    podman("rm", "-f", name)
    versions = podman("run", "--rm", GPU_IMAGE, "python", "-c",
                      "import onnxruntime as o; print(o.__version__, *o.get_available_providers())").stdout
    assert versions.startswith("1.31.") and "CUDAExecutionProvider" in versions, versions
    try:
        podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "--read-only",
               "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "-e", "DISAN_PROVIDERS=auto", GPU_IMAGE)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, name)
        info = httpx.get(f"{url}/info").json()
        assert set(info["providers"].values()) == {"CPUExecutionProvider"}, info
        r = httpx.post(f"{url}/embed", json={"texts": ["A man is playing a guitar."]}, timeout=30)
        assert r.status_code == 200 and len(r.json()["embeddings"][0]) == info["dim"]
        assert "CUDA was requested but unavailable" in logs(name)
    finally:
        podman("rm", "-f", name, check=False)


def test_gpu_image_refuses_to_start_with_cuda() -> None:
    name = "disan-ci-gpu-cuda"
    podman("rm", "-f", name)
    try:
        done = podman("run", "--name", name, "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
                      "-e", "DISAN_PROVIDERS=cuda", GPU_IMAGE, timeout=120, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 3, output[-3000:]
        assert "providers=cuda but the session runs on CPUExecutionProvider" in output, output[-3000:]
    finally:
        podman("rm", "-f", name, check=False)
