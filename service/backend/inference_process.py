"""The shared inference process (`disan serve --inference-process shared`).

One process owns the runtime (on a GPU: the one CUDA context) and one `MicroBatcher` per graph,
the same code a worker runs in-process; every HTTP worker sends it its batcher payloads over a
Unix socket (service.backend.remote, frames in service.backend.wire), so one call holds sentences from every
worker and the batches fill N times faster than N separate queues do.

Lifecycle: `disan serve` starts it (`start`) before the uvicorn workers; it loads and warms the
bundle and only then binds its socket, so a worker that connects finds it ready. It ignores
SIGINT and SIGTERM: `disan serve` owns the shutdown, drains the workers first and then closes the
process's stdin, on which it finishes what is queued and exits (an ended stdin also means
`disan serve` died). If it dies, `disan serve` notices, stops the workers and exits non-zero;
the workers answer 503 meanwhile (service.backend.remote).

    python -m service.backend.inference_process SOCKET   # settings from DISAN_* like `disan serve`
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from disan.runtime.runtime import Runtime
from service.backend import wire
from service.backend.batcher import BatchStats, MicroBatcher
from service.backend.model import STOP_GRACE_S, load_runtime, make_batchers
from service.backend.remote import INFERENCE_SOCKET_ENV
from service.common.batching_defaults import resolve_batching
from service.common.errors import NotReady, Overloaded, ServiceError
from service.common.metrics import Metrics
from service.common.timing import RequestTiming
from service.settings import Settings

log = logging.getLogger("disan.service.inference")


class InferenceServer:
    """Runtime + batchers behind a Unix socket; any number of worker connections."""

    def __init__(self, settings: Settings, socket_path: str):
        self.settings = settings
        self.socket_path = socket_path
        self.runtime: Runtime | None = None
        self.batchers: dict[str, MicroBatcher] = {}
        self.counts: dict[str, dict[str, int]] = {}  # per graph: calls, sentences, largest call
        self._hello: dict[str, Any] = {}
        self._server: asyncio.AbstractServer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: set[asyncio.Task] = set()
        self._metrics: Metrics | None = None

    async def start(self) -> None:
        """Load + warm the bundle, start the batchers, then listen."""
        s = self.settings
        # The only process running onnxruntime: the call layout counts it as one worker.
        runtime = await asyncio.get_running_loop().run_in_executor(None, load_runtime, s, 1)
        self.runtime = runtime
        self._executor = ThreadPoolExecutor(len(runtime.graphs) * runtime.batch_concurrency,
                                            thread_name_prefix="ort")
        self._metrics = Metrics()  # in the workers' shared directory: their /metrics show our batches
        stats = BatchStats(on_batch=self._on_batch, on_depth=self._metrics.on_depth)
        batching = resolve_batching(s.max_batch_size, s.max_batch_cells, runtime.provider,
                                    s.batch_concurrency)
        # It holds every worker's queue, so its bound is theirs together.
        self.batchers = make_batchers(runtime, s, batching, self._executor, stats, s.queue_limit * s.workers)
        for batcher in self.batchers.values():
            await batcher.start()
        self._hello = {
            "name": runtime.name, "dim": runtime.dim, "provider": runtime.provider,
            "providers": runtime.providers, "variant": runtime.variant, "graph_set": runtime.graph_set,
            "labels": runtime.labels, "max_tokens": runtime.max_tokens, "graphs": list(runtime.graphs),
            "batch_concurrency": runtime.batch_concurrency, "manifest": runtime.manifest, "pid": os.getpid(),
            "batching": {"max_batch_size": batching.max_batch_size,
                         "max_batch_cells": batching.max_batch_cells, "source": batching.source},
        }
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.socket_path)
        log.info("inference process ready: %s on %s, listening on %s", runtime.name, runtime.providers,
                 self.socket_path)

    def _on_batch(self, graph: str, size: int, cells: int, seconds: float) -> None:
        c = self.counts.setdefault(graph, {"calls": 0, "sentences": 0, "largest": 0})
        c["calls"] += 1
        c["sentences"] += size
        c["largest"] = max(c["largest"], size)
        if self._metrics is not None:
            self._metrics.on_batch(graph, size, cells, seconds)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's connection: requests run concurrently, replies go back as they finish."""
        mine: dict[int, asyncio.Task] = {}  # by request id: what CANCEL names
        try:
            while True:
                buf = await wire.read_frame(reader)
                request_id, op = wire.request_head(buf)
                if op == wire.CANCEL:  # its caller left: the batcher withdraws its items
                    if (task := mine.get(request_id)) is not None:
                        task.cancel()
                    continue
                task = asyncio.create_task(self._answer(buf, writer))
                mine[request_id] = task
                task.add_done_callback(lambda _, i=request_id: mine.pop(i, None))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker went away: what it still waits for is withdrawn below
        finally:
            for task in list(mine.values()):
                task.cancel()
            writer.close()

    async def _answer(self, buf: memoryview, writer: asyncio.StreamWriter) -> None:
        request_id = 0
        try:
            request_id, op, graph, payloads = wire.parse_request(buf)
            if op == wire.HELLO:
                frame = wire.reply_json(request_id, self._hello)
            elif op == wire.STATS:
                frame = wire.reply_json(request_id, self.counts)
            else:
                batcher = self.batchers.get(graph)
                if batcher is None:
                    raise NotReady(f"no {graph} graph in the inference process")
                timing = RequestTiming()
                results = await batcher.run(payloads, timing)
                frame = wire.reply_ok(request_id, results, (timing.queue_s, timing.inference_s,
                                                            batcher.queued_seconds(), batcher.item_seconds()))
        except asyncio.CancelledError:
            raise
        except Overloaded as exc:
            frame = wire.reply_error(request_id, wire.OVERLOADED, exc.message,
                                     int(exc.headers.get("Retry-After", 1)))
        except ServiceError as exc:
            frame = wire.reply_error(request_id, wire.NOT_READY, exc.message)
        except Exception as exc:  # noqa: BLE001 - the worker reports a 500; the details stay in this log
            log.error("inference failed: %r", exc)
            frame = wire.reply_error(request_id, wire.FAILED, f"{type(exc).__name__}: {exc}")
        if not writer.is_closing():
            writer.write(frame)

    async def stop(self) -> None:
        """Stop listening, finish what is queued (the workers have drained already), release."""
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(b.stop(STOP_GRACE_S) for b in self.batchers.values()))
        for task in list(self._tasks):
            task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._metrics is not None:
            self._metrics.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


async def serve(settings: Settings, socket_path: str) -> None:
    """Run until stdin ends (`disan serve` closes it to stop us, or died)."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def watch_stdin() -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdin.buffer.read()
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=watch_stdin, name="parent-watch", daemon=True).start()
    server = InferenceServer(settings, socket_path)
    await server.start()
    await done.wait()
    log.info("inference process stopping")
    await server.stop()


def start(socket_path: str | Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the inference process (settings from DISAN_* in `env`, default this process's);
    its stdin is the pipe whose closing stops it."""
    return subprocess.Popen([sys.executable, "-m", "service.backend.inference_process", str(socket_path)],
                            stdin=subprocess.PIPE, env=env)


def stop(proc: subprocess.Popen, timeout: float) -> int:
    """Close its stdin (it finishes what is queued and exits); kill it after `timeout` s."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class InferenceSupervisor:
    """The shared inference process of `disan serve`: started before the workers, watched while
    they serve (if it dies, SIGTERM to ourselves stops the workers, which answer 503 meanwhile,
    and `disan serve` exits 1), stopped after they have drained."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self.proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self.died: str | None = None

    def start(self) -> None:
        os.environ[INFERENCE_SOCKET_ENV] = self.socket_path  # the workers inherit it
        self.proc = start(self.socket_path)
        threading.Thread(target=self._watch, name="inference-watch", daemon=True).start()

    def _watch(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        if self._stopping.is_set():
            return
        self.died = f"status {code}"
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own handler: the workers stop

    def stop(self) -> str | None:
        """Stop the process (the workers are done); why it had died before, if it had."""
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc, STOP_GRACE_S + 1)
        return self.died


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m service.backend.inference_process SOCKET", file=sys.stderr)
        return 2
    # `disan serve` owns the shutdown (it drains the workers before stopping us): a Ctrl-C to the
    # process group or a stray SIGTERM must not end the inference under requests still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(settings, argv[0]))
    except Exception as exc:  # noqa: BLE001 - one line that says why; `disan serve` exits with us
        log.error("inference process failed: %s: %s", type(exc).__name__, exc)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
