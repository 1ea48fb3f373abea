"""Dynamic micro-batching: many concurrent requests -> few, well-packed onnxruntime calls.

One `MicroBatcher` per graph owns a FIFO of pending items and ONE worker task, which keeps at most
`concurrency` ORT calls in flight (1 by default; e.g. 2 single-threaded calls on 2 cores):

1. wait for the first item, then collect until `max_batch_size` items or `max_wait_ms` passed;
2. drop items whose caller went away (cancelled future);
3. sort by length and cut into sub-batches whose padded cells (batch x max_len^2, because DiSAN's
   token2token attention is quadratic in length) stay within `max_batch_cells`, so padding is small
   and no batch can exhaust memory;
4. run each sub-batch in an executor thread (ORT releases the GIL; the event loop stays free),
   starting the next one when a call slot frees up, and collecting again once all are started;
5. deliver each result, or the batch's exception, to every waiting future. A failing batch never
   kills the worker.

The pending FIFO is bounded: a request that does not fit is refused at once (`Overloaded`, 429)
instead of queueing unboundedly. The FIFO is a deque + Event rather than `asyncio.Queue` so that a
timed wait can never lose an item, and a request's items are enqueued all-or-nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from disan.batching import split_by_cells
from service.errors import NotReady, Overloaded

log = logging.getLogger("disan.service.batcher")

P = TypeVar("P")  # payload of one item (e.g. token ids of one sentence)
R = TypeVar("R")  # result of one item (e.g. one embedding row)

Runner = Callable[[list[Any]], Sequence[Any]]


@dataclass
class BatchStats:
    """Observer hooks (metrics); every callback is optional."""

    on_batch: Callable[[str, int, int, float], None] | None = None  # graph, size, cells, seconds
    on_depth: Callable[[str, int], None] | None = None  # graph, pending items


@dataclass(eq=False)
class _Item:
    payload: Any
    length: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class MicroBatcher(Generic[P, R]):
    """Collects items from concurrent callers and runs them in padded-cell-bounded batches."""

    def __init__(self, name: str, runner: Runner, *, length: Callable[[Any], int] = len,
                 max_batch_size: int = 64, max_wait_ms: float = 0.0, max_batch_cells: int = 4096,
                 queue_limit: int = 4096, concurrency: int = 1, executor: Executor | None = None,
                 stats: BatchStats | None = None):
        self.name = name
        self.runner = runner
        self.length = length
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_cells = max_batch_cells
        self.queue_limit = queue_limit
        self.concurrency = concurrency
        self.executor = executor
        self.stats = stats or BatchStats()
        self._pending: deque[_Item] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._last_batch_s = 0.01  # running estimate for Retry-After

    @property
    def depth(self) -> int:
        """Items waiting to be batched."""
        return len(self._pending)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the worker task on the running loop."""
        if self.running:
            return
        self._closing = False
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._worker(), name=f"batcher-{self.name}")

    async def stop(self, timeout: float = 30.0) -> None:
        """Refuse new items, finish everything already queued (drain), then end the worker."""
        self._closing = True
        self._wakeup.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            log.warning("batcher %s: drain timed out; cancelling %d items", self.name, self.depth)
            self._task.cancel()
            while self._pending:
                self._pending.popleft().future.cancel()
        self._task = None

    def submit(self, payloads: Sequence[P]) -> list[asyncio.Future]:
        """Enqueue all `payloads` (all-or-nothing) and return one future per payload."""
        if self._closing or not self.running:
            raise NotReady("server is shutting down" if self._closing else "batcher not running")
        if len(self._pending) + len(payloads) > self.queue_limit:
            retry = max(1, round(self._last_batch_s * (1 + self.depth / self.max_batch_size)))
            raise Overloaded(f"server busy: {self.depth} sentences queued for {self.name} "
                             f"(limit {self.queue_limit})", retry_after=retry)
        loop = asyncio.get_running_loop()
        items = [_Item(p, max(1, self.length(p)), loop.create_future()) for p in payloads]
        self._pending.extend(items)
        self._wakeup.set()
        self._report_depth()
        return [it.future for it in items]

    async def run(self, payloads: Sequence[P]) -> list[R]:
        """Submit `payloads` and wait for their results, in the same order.

        If the caller is cancelled (client went away), its futures are cancelled too so the
        worker skips them.
        """
        futures = self.submit(payloads)
        try:
            if len(futures) == 1:  # the common case: no gather future and its callbacks
                return [await futures[0]]
            return list(await asyncio.gather(*futures))
        except BaseException:
            for fut in futures:
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():
                    fut.exception()  # mark retrieved: one failure is reported, not N warnings
            raise

    async def _collect(self) -> list[_Item]:
        """Wait for the first item, then gather more until full or the deadline passes."""
        while not self._pending:
            if self._closing:
                return []
            self._wakeup.clear()
            await self._wakeup.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        batch: list[_Item] = []
        while True:
            while self._pending and len(batch) < self.max_batch_size:
                batch.append(self._pending.popleft())
            remaining = deadline - loop.time()
            if len(batch) >= self.max_batch_size or remaining <= 0 or self._closing:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                while self._pending and len(batch) < self.max_batch_size:
                    batch.append(self._pending.popleft())
                break
        self._report_depth()
        return batch

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.concurrency)
        in_flight: set[asyncio.Task] = set()
        live: list[_Item] = []
        try:
            while True:
                # A free ORT slot first, then collect: what queued while the slots were busy
                # joins this batch (with concurrency 1: strictly one call after another).
                await slots.acquire()
                slots.release()
                batch = await self._collect()
                if not batch:
                    if self._closing and not self._pending:
                        break
                    continue
                live = sorted((it for it in batch if not it.future.done()), key=lambda it: it.length)
                for part in split_by_cells([it.length for it in live], self.max_batch_cells,
                                           self.max_batch_size):
                    await slots.acquire()
                    # Re-check: a caller may have gone away while an earlier sub-batch ran.
                    items = [it for it in (live[i] for i in part) if not it.future.done()]
                    if not items:
                        slots.release()
                        continue
                    task = asyncio.create_task(self._run_batch(loop, items))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    task.add_done_callback(lambda _: slots.release())
            await asyncio.gather(*in_flight)  # drain: every started batch delivers its results
        except asyncio.CancelledError:
            for task in in_flight:
                task.cancel()
            for it in live:  # hard stop: nobody may wait forever on a dropped batch
                it.future.cancel()
            raise

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, items: list[_Item]) -> None:
        """Run one sub-batch off the event loop and fan the outcome out to every future."""
        cells = len(items) * max(it.length for it in items) ** 2
        t0 = time.perf_counter()
        try:
            results = await loop.run_in_executor(self.executor, self.runner,
                                                 [it.payload for it in items])
            if len(results) != len(items):
                raise RuntimeError(f"runner returned {len(results)} results for {len(items)} items")
        except asyncio.CancelledError:  # hard stop: nobody may wait forever on a dropped batch
            for it in items:
                it.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every failure goes to the callers, worker lives on
            log.error("batcher %s: batch of %d failed: %r", self.name, len(items), exc)
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        finally:
            elapsed = time.perf_counter() - t0
            self._last_batch_s = 0.8 * self._last_batch_s + 0.2 * elapsed
            if self.stats.on_batch:
                self.stats.on_batch(self.name, len(items), cells, elapsed)
        for it, result in zip(items, results, strict=True):
            if not it.future.done():
                it.future.set_result(result)

    def _report_depth(self) -> None:
        if self.stats.on_depth:
            self.stats.on_depth(self.name, len(self._pending))
