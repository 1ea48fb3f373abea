"""Admission control: decide on arrival, before any of a request's work is done, whether it runs.

Under overload the expensive part of a request is not the refusal but what comes before it
(reading, parsing and tokenizing a body only to find the queue full), so an inference request is
admitted or held on arrival, from two numbers the worker already has:

- at most `limit` inference requests are in progress per worker (memory and CPU bound);
- a request whose declared body is over `SMALL_BODY` bytes also waits while the work queued in
  the batchers is estimated at more than `max_queue_wait_s` seconds (sentences waiting x the
  recent seconds per sentence, service.backend.batcher): the wait of what is admitted stays short
  whatever the CPU manages at the moment. Small requests (a few sentences) pass bigger ones in the
  batcher, so a queue of big requests does not delay them: only the request limit holds them.

A request that cannot run at once waits, without its body being read, up to `wait_s` for room;
the newest waiter is admitted first (under overload, first-in-first-out would admit only requests
that already waited the longest, making every answer late), and one that is not admitted in time
gets 429 with a `Retry-After` of the estimated queue wait. Waiting costs no CPU, and it paces
clients that retry at once: each refusal takes `wait_s`, so refusals cannot become a storm that
takes the CPU from the admitted requests.

Both front ends use it the same way: `await admit()` before the body is read, `enter()` once the
body is in (a client that uploads slowly holds no slot while it does), `leave()` when the answer
is sent.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from service.common.errors import Overloaded

# Bodies up to this size (a few sentences) are not held back by a long queue (module docstring).
SMALL_BODY = 1024
# While requests wait, how often the queue estimate is looked at again (it falls as calls finish).
RECHECK_S = 0.02


class Admission:
    """Admits, holds or refuses one worker's inference requests (see the module docstring)."""

    def __init__(self, limit: int, wait_s: float = 0.0, max_queue_wait_s: float = math.inf,
                 queued_seconds: Callable[[], float] = lambda: 0.0,
                 on_change: Callable[[int], None] | None = None):
        self.limit = limit
        self.wait_s = wait_s
        self.max_queue_wait_s = max_queue_wait_s
        self.queued_seconds = queued_seconds  # the batchers' estimate of the work waiting
        self.on_change = on_change  # metrics: requests in progress
        self.active = 0
        self._granted = 0  # waiters let in whose tasks have not resumed yet
        self._waiting: list[tuple[int | None, asyncio.Future]] = []  # a stack: newest last
        self._rechecks: asyncio.Task | None = None

    def admissible(self, body_bytes: int | None) -> bool:
        """Whether a request of this declared size (None: unknown) may start now."""
        if self.active + self._granted >= self.limit:
            return False
        small = body_bytes is not None and body_bytes <= SMALL_BODY
        return small or self.queued_seconds() <= self.max_queue_wait_s

    async def admit(self, body_bytes: int | None) -> None:
        """Return when the request may start; Overloaded (429) after `wait_s` without room."""
        if self.admissible(body_bytes):
            return
        if self.wait_s <= 0:
            raise self._refusal()
        waiter = asyncio.get_running_loop().create_future()
        entry = (body_bytes, waiter)
        self._waiting.append(entry)
        if self._rechecks is None or self._rechecks.done():
            self._rechecks = asyncio.create_task(self._recheck_while_waiting())
        try:
            await asyncio.wait_for(waiter, self.wait_s)
        except TimeoutError:
            raise self._refusal() from None
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)
            if waiter.done() and not waiter.cancelled():
                self._granted -= 1  # this task resumed: its own enter() counts it from now

    def enter(self) -> None:
        """Take a slot (or raise Overloaded at the request limit)."""
        if self.active >= self.limit:
            raise self._refusal()
        self.active += 1
        if self.on_change is not None:
            self.on_change(self.active)

    def leave(self) -> None:
        """Give the slot back (and let the newest waiter in, if it may start now)."""
        self.active -= 1
        if self.on_change is not None:
            self.on_change(self.active)
        self._wake_one()

    def _wake_one(self) -> None:
        """Admit the newest waiter if it may start now; one at a time (none while a woken one has
        not resumed), since its work only shows in the queue estimate once it is submitted."""
        while self._waiting and not self._granted:
            body_bytes, waiter = self._waiting[-1]
            if waiter.done():  # timed out meanwhile
                self._waiting.pop()
                continue
            if self.admissible(body_bytes):
                self._waiting.pop()
                self._granted += 1
                waiter.set_result(None)
            return

    async def _recheck_while_waiting(self) -> None:
        while self._waiting:
            await asyncio.sleep(RECHECK_S)
            self._wake_one()

    def _refusal(self) -> Overloaded:
        queued = self.queued_seconds()
        return Overloaded(f"server busy: {self.active} requests in progress (limit {self.limit}), "
                          f"about {queued:.1f} s of work queued (limit {self.max_queue_wait_s:g} s)",
                          retry_after=max(1, math.ceil(queued)))
