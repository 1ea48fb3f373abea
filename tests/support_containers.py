"""What the live container tests (tests/repo/test_containers_live.py) drive the containers with:
podman and podman-compose calls, a compose project of its own, readiness, the compose file as
compose reads it. Imported only once that module has found podman (it skips without it)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE, SCALE = ROOT / "docker-compose.yml", ROOT / "docker-compose.scale.yml"
CPU_IMAGE = os.environ.get("DISAN_CPU_IMAGE", "localhost/disan-serve:cpu")
GPU_IMAGE = os.environ.get("DISAN_GPU_IMAGE", "localhost/disan-serve:gpu-debian")
LB_IMAGE = os.environ.get("DISAN_LB_IMAGE", "localhost/disan-nginx:debian")
SERVICE_UID = 10001
READY_TIMEOUT_S = 180  # two cold starts on a shared 2-core machine
# A sentence of ~100 tokens: 64 of them keep a request busy long enough to be in flight at SIGTERM.
LONG_TEXT = " ".join(["a man in a red shirt is playing a guitar on a small stage"] * 8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} -> {done.returncode}\n{done.stderr[-3000:]}")
    return done


@dataclass
class Project:
    """One podman-compose project (a unique name, so it never touches other containers)."""

    name: str
    files: tuple[Path, ...]
    env: dict[str, str]

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        files = [a for f in self.files for a in ("-f", str(f))]
        done = subprocess.run(["podman-compose", "-p", self.name, *files, "--profile", "cpu", *args],
                              cwd=ROOT, env={**os.environ, **self.env}, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, f"podman-compose {' '.join(args)}:\n{done.stdout[-2000:]}" \
                                     f"\n{done.stderr[-3000:]}"
        return done

    def containers(self, service: str) -> list[str]:
        out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={self.name}",
                     "--filter", f"label=io.podman.compose.service={service}",
                     "--format", "{{.Names}}").stdout
        return sorted(out.split())

    def down(self) -> None:
        files = [a for f in self.files for a in ("-f", str(f))]
        subprocess.run(["podman-compose", "-p", self.name, *files, "--profile", "cpu", "down", "-t", "5"],
                       cwd=ROOT, env={**os.environ, **self.env}, capture_output=True, timeout=120)


def inspect(container: str) -> dict:
    return json.loads(podman("inspect", container).stdout)[0]


def logs(container: str) -> str:
    done = podman("logs", container, check=False)
    return done.stdout + done.stderr


def in_container(container: str, code: str) -> str:
    """Run Python in the container (its /metrics etc. are reachable only from inside)."""
    return podman("exec", container, "python", "-c", code).stdout


def wait_ready(url: str, container: str | None = None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if container and inspect(container)["State"]["Status"] != "running":
            raise AssertionError(f"{container} stopped:\n{logs(container)[-3000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    tail = logs(container)[-3000:] if container else ""
    raise AssertionError(f"{url}/ready never answered 200 within {READY_TIMEOUT_S} s\n{tail}")


def compose_service(name: str) -> dict:
    """A service of docker-compose.yml as compose sees it (anchors merged)."""
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("!", lambda loader, _tag, node: loader.construct_scalar(node))
    return yaml.load(COMPOSE.read_text(encoding="utf-8"), Loader=Loader)["services"][name]


def seconds(duration: str) -> float:
    """Compose duration ("40s", "1m30s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def example_bodies(spec: dict, operation: dict) -> list[dict]:
    """The first example of each body a route takes (ours, and TEI's where it takes both: a
    `oneOf` of schemas; schemas carry examples by design)."""
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    bodies = []
    for ref in [s["$ref"] for s in schema.get("oneOf", schema.get("anyOf", [schema]))]:
        named = spec["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        assert named.get("examples"), f"{ref} has no example"
        bodies.append(named["examples"][0])
    return bodies
