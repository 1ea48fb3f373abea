"""Dynamic micro-batching: many concurrent requests -> few, well-packed onnxruntime calls.

One `MicroBatcher` per graph owns the pending requests and ONE worker task, which keeps at most
`concurrency` ORT calls in flight (1 by default; e.g. 2 single-threaded calls on 2 cores). Each
time a call slot is free the worker builds ONE call:

1. wait for the first item (and, with `max_wait_ms` > 0, until `max_batch_size` items wait or the
   deadline passes);
2. rank the pending requests by fewest sentences left (ties: the oldest first; when the oldest
   request has had no item in `OLDEST_EVERY` calls: oldest first) and take up to
   `max_batch_size` candidates from them in
   that order, each request's shortest first; sort the candidates by length and cut them into
   parts within `max_batch_size` items and `max_batch_cells` padded cells (batch x max_len^2:
   DiSAN's token2token attention is quadratic in length); the call is the part holding the
   top-ranked request's next sentence, the rest go back. Fewest-left-first lets a one-sentence
   request pass a 256-sentence one (it waits about one call, not the big request's whole queue)
   and keeps requests of equal size about in arrival order (a round-robin would finish them all
   late); the oldest-first turn guarantees a big request a share of the calls however many small
   ones keep arriving, and is only taken when needed: while the oldest request is served anyway
   (one long document after another), a small request never waits behind a forced turn;
   the length sort keeps the padding small;
3. run the call in an executor thread (ORT releases the GIL; the event loop stays free);
4. deliver each result, or the call's exception, to every waiting future. A failing call never
   kills the worker; items whose caller went away (cancelled future) are skipped.

Each item remembers its call (`_Call`: when it ran, how big it was), from which `run` adds the
request's queue and model time to its `RequestTiming`, and, while the request is traced, one
`queue` stage and one `inference` stage per call that ran its items (service.http.tracing).

The pending items are bounded: a request that does not fit is refused at once (`Overloaded`, 429)
and a request's items are enqueued all-or-nothing. `abort` fails every pending and running item at
once (the drain deadline: callers answer 503 instead of being cut off).
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

from disan.runtime.batching import split_by_cells
from service.common.errors import NotReady, Overloaded
from service.common.timing import RequestTiming, Stage

log = logging.getLogger("disan.service.batcher")

# The oldest request waits at most this many calls in a row without an item: a big request's
# share of the calls while small ones keep arriving.
OLDEST_EVERY = 4

P = TypeVar("P")  # payload of one item (e.g. token ids of one sentence)
R = TypeVar("R")  # result of one item (e.g. one embedding row)

Runner = Callable[[list[Any]], Sequence[Any]]


@dataclass
class BatchStats:
    """Observer hooks (metrics); every callback is optional."""

    on_batch: Callable[[str, int, int, float], None] | None = None  # graph, size, cells, seconds
    on_depth: Callable[[str, int], None] | None = None  # graph, pending items


@dataclass(eq=False, slots=True)
class _Call:
    """One onnxruntime call: its number in this batcher, its rows, when it ran."""

    seq: int
    size: int
    longest: int  # the longest row's length: every row of the call is padded to it
    started: float
    finished: float = 0.0


@dataclass(eq=False)
class _Item:
    payload: Any
    length: int
    future: asyncio.Future
    request: _Request | None = None
    call: _Call | None = None  # the call that ran it


@dataclass(eq=False)
class _Request:
    """One `submit` call's items that no call has taken yet, shortest first."""

    items: deque[_Item]
    served: int = 0  # the batcher's call count when this request last got an item (or arrived)
    enqueued: float = field(default_factory=time.perf_counter)

    def head(self) -> _Item | None:
        """The next live item (items whose caller went away are dropped on the way)."""
        while self.items and self.items[0].future.done():
            self.items.popleft()
        return self.items[0] if self.items else None


class MicroBatcher(Generic[P, R]):
    """Collects items from concurrent callers and runs them in fair, padded-cell-bounded calls."""

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
        self._queue: deque[_Request] = deque()  # arrival order
        self._calls = 0
        self._ran = 0  # calls started (their `_Call.seq`)
        self._depth = 0  # items in self._queue (cancelled ones until they are dropped)
        self._running: set[tuple[_Item, ...]] = set()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._last_batch_s = 0.01  # running estimate for Retry-After
        # Running estimate of one call's seconds per item; the prior errs on the slow side (a
        # long sentence on one CPU core) so a burst at start-up is not all admitted at once.
        self._item_s = 0.005

    @property
    def depth(self) -> int:
        """Items waiting to be batched."""
        return self._depth

    def queued_seconds(self) -> float:
        """Estimated seconds until the items waiting now have run (admission control)."""
        return self._depth * self._item_s / self.concurrency

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
        """Refuse new items, finish everything already queued (drain), then end the worker; past
        `timeout` seconds what is left is cancelled."""
        self._closing = True
        self._wakeup.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            log.warning("batcher %s: drain timed out; cancelling %d items", self.name, self.depth)
            self._task.cancel()
            self._fail_pending(None)
        self._task = None

    def abort(self, exc: BaseException) -> int:
        """Fail every pending and running item with `exc` at once (the callers answer with it);
        refuse new items. Returns how many callers were told."""
        self._closing = True
        self._wakeup.set()
        told = self._fail_pending(exc)
        for items in self._running:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
                    told += 1
        return told

    async def run(self, payloads: Sequence[P], timing: RequestTiming | None = None) -> list[R]:
        """Submit `payloads` and wait for their results, in the same order; add where the time
        went to `timing`.

        If the caller is cancelled (client went away), its items are withdrawn so the worker
        never runs them.
        """
        request, items = self._enqueue(payloads)
        try:
            if len(items) == 1:  # the common case: no gather future and its callbacks
                results = [await items[0].future]
            else:
                results = list(await asyncio.gather(*(it.future for it in items)))
        except BaseException:
            self._withdraw(request)
            for it in items:
                if not it.future.done():
                    it.future.cancel()
                elif not it.future.cancelled():
                    it.future.exception()  # mark retrieved: one failure is reported, not N warnings
            raise
        if timing is not None:
            first = min(it.call.started for it in items)
            timing.queue_s += first - request.enqueued
            timing.inference_s += max(it.call.finished for it in items) - first
            timing.inferred = True
            if timing.stages is not None:
                self._trace(timing.stages, request.enqueued, first, items)
        return results

    def _trace(self, stages: list[Stage], enqueued: float, first: float, items: list[_Item]) -> None:
        """A traced request's `queue` stage (enqueued -> its first call began) and one `inference`
        stage per call that ran some of its items, with that call's size (all requests' rows)."""
        stages.append(Stage("queue", enqueued, first, {"disan.graph": self.name, "disan.rows": len(items)}))
        lengths: dict[_Call, list[int]] = {}
        for it in items:
            lengths.setdefault(it.call, []).append(it.length)
        for call, mine in lengths.items():
            stages.append(Stage("inference", call.started, call.finished, {
                "disan.graph": self.name, "disan.batch.id": f"{self.name}#{call.seq}",
                "disan.batch.size": call.size, "disan.batch.padded_tokens": call.size * call.longest,
                "disan.rows": len(mine), "disan.tokens": sum(mine)}))

    def _enqueue(self, payloads: Sequence[P]) -> tuple[_Request, list[_Item]]:
        if self._closing or not self.running:
            raise NotReady("server is shutting down" if self._closing else "batcher not running")
        if self._depth + len(payloads) > self.queue_limit:
            retry = max(1, round(self._last_batch_s * (1 + self._depth / self.max_batch_size)))
            raise Overloaded(f"server busy: {self._depth} sentences queued for {self.name} "
                             f"(limit {self.queue_limit})", retry_after=retry)
        loop = asyncio.get_running_loop()
        items = [_Item(p, max(1, self.length(p)), loop.create_future()) for p in payloads]
        request = _Request(deque(sorted(items, key=lambda it: it.length)), served=self._calls)
        for it in items:
            it.request = request
        self._queue.append(request)
        self._depth += len(items)
        self._wakeup.set()
        self._report_depth()
        return request, items

    def _withdraw(self, request: _Request) -> None:
        """Take a request whose caller left out of the queue (its items no longer count)."""
        if request.items:
            try:
                self._queue.remove(request)
            except ValueError:
                return
            self._depth -= len(request.items)
            request.items.clear()
            self._report_depth()

    def _fail_pending(self, exc: BaseException | None) -> int:
        """Fail (exc) or cancel (None) every queued item; empty the queue."""
        told = 0
        for request in self._queue:
            for it in request.items:
                if it.future.done():
                    continue
                if exc is None:
                    it.future.cancel()
                else:
                    it.future.set_exception(exc)
                told += 1
        self._queue.clear()
        self._depth = 0
        self._report_depth()
        return told

    def _take(self) -> list[_Item]:
        """One call's items (see the module docstring, step 2)."""
        self._calls += 1
        oldest = next((r for r in self._queue if r.head() is not None), None)
        if oldest is not None and self._calls - oldest.served >= OLDEST_EVERY:
            order = list(self._queue)
        else:
            order = sorted(self._queue, key=lambda r: len(r.items))  # stable: ties stay oldest first
        # Candidates: up to max_batch_size items, whole requests in priority order, each
        # request's shortest first; the first candidate is the one this call must serve.
        candidates: list[_Item] = []
        for request in order:
            while request.head() is not None and len(candidates) < self.max_batch_size:
                candidates.append(request.items.popleft())
            if len(candidates) >= self.max_batch_size:
                break
        if not candidates:
            self._queue = deque(r for r in self._queue if r.head() is not None)
            self._depth = sum(len(r.items) for r in self._queue)
            return []
        first = candidates[0]
        # Length-sorted and cut by the cells budget (the packing of the fixed-window batcher),
        # the call is the part holding the item that must be served.
        ranked = sorted(candidates, key=lambda it: it.length)
        at = next(i for i, it in enumerate(ranked) if it is first)
        part = next(p for p in split_by_cells([it.length for it in ranked], self.max_batch_cells,
                                              self.max_batch_size) if at in p)
        batch = [ranked[i] for i in part]
        for it in batch:
            it.request.served = self._calls
        chosen = set(map(id, batch))
        # What was not chosen goes back to the front of its request (still shortest first).
        for it in reversed(candidates):
            if id(it) not in chosen:
                it.request.items.appendleft(it)
        self._queue = deque(r for r in self._queue if r.head() is not None)
        self._depth = sum(len(r.items) for r in self._queue)
        return batch

    async def _next_call(self) -> list[_Item]:
        """Wait for the first item (and the fill window, if any), then take one call's items."""
        while not self._queue:
            if self._closing:
                return []
            self._wakeup.clear()
            await self._wakeup.wait()
        if self.max_wait > 0 and not self._closing:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.max_wait
            while self._depth < self.max_batch_size and not self._closing:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
        batch = self._take()
        self._report_depth()
        return batch

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.concurrency)
        in_flight: set[asyncio.Task] = set()
        try:
            while True:
                # A free ORT slot first, then build the call: what queued while the slots were
                # busy joins it (with concurrency 1: strictly one call after another).
                await slots.acquire()
                batch = await self._next_call()
                if not batch:
                    slots.release()
                    if self._closing and not self._queue:
                        break
                    continue
                task = asyncio.create_task(self._run_batch(loop, batch))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                task.add_done_callback(lambda _: slots.release())
            await asyncio.gather(*in_flight)  # drain: every started call delivers its results
        except asyncio.CancelledError:
            for task in in_flight:
                task.cancel()
            raise

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, items: list[_Item]) -> None:
        """Run one call off the event loop and fan the outcome out to every future."""
        cells = len(items) * items[-1].length ** 2
        running = tuple(items)
        self._running.add(running)
        self._ran += 1
        call = _Call(self._ran, len(items), items[-1].length, time.perf_counter())
        t0 = call.started
        for it in items:
            it.call = call
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
            self._running.discard(running)
            t1 = call.finished = time.perf_counter()
            self._last_batch_s = 0.8 * self._last_batch_s + 0.2 * (t1 - t0)
            self._item_s = 0.8 * self._item_s + 0.2 * (t1 - t0) / len(items)
            if self.stats.on_batch:
                self.stats.on_batch(self.name, len(items), cells, t1 - t0)
        for it, result in zip(items, results, strict=True):
            if not it.future.done():
                it.future.set_result(result)

    def _report_depth(self) -> None:
        if self.stats.on_depth:
            self.stats.on_depth(self.name, self._depth)
