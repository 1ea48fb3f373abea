"""A `disan serve` process on loopback and a load generator for it (shared by the service benches).

`Server` starts the service (or a command reading the same DISAN_* variables) on 127.0.0.1 and
waits for /ready; `load` drives POST /embed with `wrk` when installed, else with bench.load;
`thread_cpu` reads per-thread CPU time from /proc (Linux) to split a server's CPU between its
event loop and its onnxruntime threads. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

WRK_SCRIPT = """
local bodies = {}
for line in io.lines("%s") do bodies[#bodies + 1] = line end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i %% #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
done = function(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests": %%d, "seconds": %%f, "errors": %%d, "non2xx": %%d, '
    .. '"p50_ms": %%f, "p95_ms": %%f, "p99_ms": %%f}\\n', summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50) / 1e3, latency:percentile(95) / 1e3,
    latency:percentile(99) / 1e3))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM `proc` (a server drains, then exits); SIGKILL it if it is still there after `grace_s`."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_until_ready(url: str, timeout: float) -> bool:
    """Poll `url`/ready until it answers 200 (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


class Server:
    """`disan serve` (or `command`, which must read the same DISAN_* variables) in a subprocess on
    127.0.0.1 with extra DISAN_* settings; ready when /ready says 200."""

    def __init__(self, bundle: Path, command: list[str] | None = None, cwd: Path | None = None,
                 **settings: object):
        self.port = free_port()
        env = {**os.environ, **{f"DISAN_{k.upper()}": str(v) for k, v in settings.items()}}
        env.update(
            DISAN_BUNDLE=str(bundle),
            DISAN_HOST="127.0.0.1",
            DISAN_PORT=str(self.port),
            DISAN_LOG_LEVEL="warning",
        )
        # `cwd` + PYTHONPATH in the environment: serve another checkout's code (`python -m` puts
        # the working directory first on sys.path).
        self.proc = subprocess.Popen(command or [sys.executable, "-m", "disan.cli", "serve"], env=env,
                                     cwd=cwd)
        self.url = f"http://127.0.0.1:{self.port}"
        if not wait_until_ready(self.url, 120):
            self.stop()
            raise RuntimeError("server did not become ready in 120 s")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def post(self, path: str, body: dict) -> int:
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status

    def stop(self) -> None:
        stop_process(self.proc, 30)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load(url: str, bodies_file: Path, concurrency: int, seconds: float, per_request: int = 1,
         threads: int = 1) -> dict:
    """Throughput and latency of POST /embed at `concurrency` for `seconds` (`per_request`
    sentences in each body; `threads` wrk threads, for servers one wrk thread cannot saturate)."""
    if shutil.which("wrk"):
        script = Path(tempfile.mkstemp(suffix=".lua")[1])
        script.write_text(WRK_SCRIPT % bodies_file)
        out = subprocess.run(
            [
                "wrk",
                f"-t{max(1, min(threads, concurrency))}",
                f"-c{concurrency}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "30s",
                "-s",
                str(script),
                url + "/embed",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        script.unlink()
        stats = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON"))[8:])
        stats["sentences_per_s"] = per_request * (stats["requests"] - stats["non2xx"]) / stats["seconds"]
        stats["tool"] = "wrk"
        return stats
    import asyncio  # the aiohttp/httpx fallback only: needed where wrk is missing

    from bench.load import run_load

    texts = [t for b in bodies_file.read_text().splitlines() for t in json.loads(b)["texts"]]
    res = asyncio.run(run_load(url, "/embed", concurrency, 10**6, seconds, per_request, texts))
    return {
        "sentences_per_s": res.sentences_per_s,
        "p50_ms": res.p50_ms,
        "p95_ms": res.p95_ms,
        "p99_ms": res.p99_ms,
        "requests": res.sent,
        "non2xx": res.sent - res.ok,
        "tool": "bench.load",
    }


def _stat_cpu(stat_file: Path) -> float:
    """utime + stime in seconds from a /proc .../stat file."""
    fields = stat_file.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid`, all its threads together."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of process `pid`, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _stat_cpu(task / "stat")
        except OSError:  # the thread ended meanwhile
            continue
    return out


def process_tree(pid: int) -> list[int]:
    """Process `pid` and all its descendants (uvicorn workers)."""
    out, stack = [], [pid]
    while stack:
        current = stack.pop()
        out.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # it ended meanwhile
            continue
    return out


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and all its descendants; processes that ended meanwhile are
    not counted."""
    total = 0.0
    for current in process_tree(pid):
        try:
            total += process_cpu(current)
        except OSError:
            continue
    return total
