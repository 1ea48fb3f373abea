"""A worker's side of the shared inference process (`inference_process=shared`).

`InferenceClient` holds one Unix-socket connection per worker to the process `disan serve`
started (service.backend.inference_process) and multiplexes every request over it by id (frames:
service.backend.wire). `RemoteBatcher` gives the engine the interface of a `MicroBatcher` (`run`,
`queued_seconds`, `abort`, `stop`): the engine keeps its limits, tokenizing, timing and errors,
and only the "run this graph on these payloads" step crosses the socket. `RemoteRuntime` stands
in for the `Runtime` a worker no longer loads (vocab, limits, labels, what /info reports).

If the inference process goes away, every waiting request is answered 503 at once and
`on_lost` tells the engine, which answers 503 from then on: nothing waits on a dead process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disan.runtime.runtime import ExplainFlags
from disan.text.tokenizer import Vocab
from service.backend import wire
from service.common.errors import NotReady, Overloaded
from service.common.timing import RequestTiming

log = logging.getLogger("disan.service.remote")
# `disan serve` tells its workers where the inference process listens (internal: not a setting,
# so no DISAN_ prefix).
INFERENCE_SOCKET_ENV = "_DISAN_INFERENCE_SOCKET"
# Writes wait for the socket to drain only past this much buffered (large requests); small ones
# are written and left to the transport, which is what keeps a one-sentence hop cheap.
_DRAIN_ABOVE = 1 << 20


class RemoteInferenceError(RuntimeError):
    """An onnxruntime call failed in the inference process (the engine reports it as a 500)."""


@dataclass
class _Pending:
    future: asyncio.Future
    graph: str
    items: int
    sent: float


class InferenceClient:
    """One connection to the inference process; requests are matched to replies by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        # From the last reply, for admission control: the shared queue's estimated seconds, and
        # what one more waiting sentence adds (MicroBatcher's prior until the first reply).
        self.queued_s, self.item_s = 0.0, 0.005
        self.lost: str | None = None
        self.on_lost: Callable[[str], None] | None = None
        self._reader_task = asyncio.create_task(self._read_replies(), name="inference-replies")

    @classmethod
    async def connect(cls, path: str, timeout: float) -> InferenceClient:
        """Connect once the inference process listens (it binds its socket when its bundle is
        loaded and warm, so this is also the wait for it to be ready)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(path)
                return cls(reader, writer)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the inference process did not listen on {path} within "
                                       f"{timeout:g} s") from None
                await asyncio.sleep(0.05)

    def pending_items(self, graph: str) -> int:
        return sum(p.items for p in self._pending.values() if p.graph == graph)

    async def _call(self, op: int, graph: str = "", payloads: Sequence[Any] = ()) -> tuple[memoryview, float]:
        if self.lost is not None:
            raise NotReady(f"the inference process is gone ({self.lost})")
        request_id = next(self._ids) & 0xFFFFFFFF
        future = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        self._pending[request_id] = _Pending(future, graph, len(payloads), sent)
        try:
            self._writer.write(wire.request(request_id, op, graph, payloads))
            if self._writer.transport.get_write_buffer_size() > _DRAIN_ABOVE:
                await self._writer.drain()
            return await future, sent
        finally:
            self._pending.pop(request_id, None)
            if future.cancelled() and self.lost is None and not self._writer.is_closing():
                # The caller left (client gone): the inference process withdraws its items, as a
                # worker's own batcher does, instead of running them for nobody.
                self._writer.write(wire.request(request_id, wire.CANCEL))

    async def run(self, graph: str, payloads: Sequence[Any], timing: RequestTiming | None) -> list[Any]:
        buf, sent = await self._call(wire.RUN, graph, payloads)
        results, (queue_s, inference_s, queued_s, item_s) = wire.parse_run_reply(buf)
        self.queued_s, self.item_s = queued_s, item_s
        if timing is not None:
            # The hop (both ways) counts as queueing: the inference time is the model's alone.
            timing.queue_s += max(0.0, time.perf_counter() - sent - inference_s)
            timing.inference_s += inference_s
            timing.inferred = True
        return results

    async def hello(self) -> dict:
        """What the inference process serves (model, graphs, provider, batching)."""
        return wire.parse_json_reply((await self._call(wire.HELLO))[0])

    async def stats(self) -> dict:
        """Per graph: calls and sentences run in the inference process (all workers together)."""
        return wire.parse_json_reply((await self._call(wire.STATS))[0])

    async def _read_replies(self) -> None:
        why = "connection closed"
        try:
            while True:
                buf = await wire.read_frame(self._reader)
                request_id, status = wire.parse_reply_head(buf)
                pending = self._pending.get(request_id)
                if pending is None or pending.future.done():
                    continue
                if status == wire.OK:
                    pending.future.set_result(buf)
                else:
                    pending.future.set_exception(_error(*wire.parse_error(buf)))
        except asyncio.CancelledError:
            why = "worker stopping"
            raise
        except (asyncio.IncompleteReadError, ConnectionError, OSError, wire.WireError) as exc:
            why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, asyncio.IncompleteReadError) else why
        finally:
            self._lose(why)

    def _lose(self, why: str) -> None:
        if self.lost is not None:
            return
        self.lost = why
        gone = NotReady(f"the inference process is gone ({why})")
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(gone)
        if why != "worker stopping" and self.on_lost is not None:
            self.on_lost(why)

    def fail_graph(self, graph: str, exc: BaseException) -> int:
        """Answer every waiting request of `graph` with `exc` now (the drain deadline)."""
        told = 0
        for pending in self._pending.values():
            if pending.graph == graph and not pending.future.done():
                pending.future.set_exception(exc)
                told += pending.items
        return told

    async def wait_graph(self, graph: str, timeout: float) -> bool:
        """Wait until no request of `graph` is waiting (True) or `timeout` passes (False)."""
        futures = [p.future for p in self._pending.values() if p.graph == graph]
        if not futures:
            return True
        _, not_done = await asyncio.wait(futures, timeout=timeout)
        return not not_done

    async def close(self) -> None:
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def _error(kind: int, retry_after: int, message: str) -> Exception:
    if kind == wire.OVERLOADED:
        return Overloaded(message, retry_after=retry_after)
    if kind == wire.NOT_READY:
        return NotReady(message)
    return RemoteInferenceError(message)


class RemoteBatcher:
    """The engine's batcher for one graph, when the batching happens in the inference process."""

    def __init__(self, client: InferenceClient, name: str, queue_limit: int):
        self.client = client
        self.name = name
        self.queue_limit = queue_limit  # this worker's share, as with its own batcher
        self._closing = False

    def queued_seconds(self) -> float:
        """This worker's sentences still waiting, or the shared queue's estimate from the last
        reply while any are (never a stale estimate once this worker has nothing waiting)."""
        waiting = self.client.pending_items(self.name)
        return max(waiting * self.client.item_s, self.client.queued_s) if waiting else 0.0

    async def run(self, payloads: Sequence[Any], timing: RequestTiming | None = None) -> list[Any]:
        if self._closing:
            raise NotReady("server is shutting down")
        waiting = self.client.pending_items(self.name)
        if waiting + len(payloads) > self.queue_limit:
            raise Overloaded(f"server busy: {waiting} sentences queued for {self.name} "
                             f"(limit {self.queue_limit})", retry_after=1)
        return await self.client.run(self.name, payloads, timing)

    def abort(self, exc: BaseException) -> int:
        self._closing = True
        return self.client.fail_graph(self.name, exc)

    async def stop(self, timeout: float = 30.0) -> None:
        """Refuse new work and wait (up to `timeout`) for what this worker has waiting."""
        self._closing = True
        if not await self.client.wait_graph(self.name, timeout):
            log.warning("remote batcher %s: drain timed out", self.name)
            self.client.fail_graph(self.name, NotReady("server is shutting down (drain timed out)"))


@dataclass
class RemoteRuntime(ExplainFlags):
    """What a worker needs of the runtime when the inference process owns it (from its hello)."""

    name: str
    dim: int
    provider: str
    providers: dict[str, str]
    variant: str
    graph_set: str
    labels: dict[str, list[str]]
    max_tokens: int
    graphs: list[str]
    batch_concurrency: int
    manifest: dict
    vocab: Vocab
    pid: int

    @classmethod
    def from_hello(cls, hello: dict, bundle: Path) -> RemoteRuntime:
        manifest = hello["manifest"]
        vocab = Vocab.load(Path(bundle) / str(manifest.get("vocab", "vocab.json")))
        keys = ("name", "dim", "provider", "providers", "variant", "graph_set", "labels", "max_tokens",
                "graphs", "batch_concurrency", "pid")
        return cls(manifest=manifest, vocab=vocab, **{k: hello[k] for k in keys})
