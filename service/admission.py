"""Admission control: refuse work the worker cannot start soon, before any of it is done.

Under overload the expensive part of a request is not the refusal but what comes before it
(reading, parsing and tokenizing a body only to find the queue full), so an inference request is
admitted or refused on arrival, from two numbers it already has:

- at most `limit` inference requests are in progress per worker (memory and CPU bound);
- a request whose declared body is over `SMALL_BODY` bytes is also refused while the work queued
  in the batchers is estimated at more than `max_queue_wait_s` seconds (sentences waiting x the
  recent seconds per sentence, service.batcher). That keeps the wait of what is admitted short
  whatever the CPU manages at the moment. Small requests (a few sentences) pass bigger ones in
  the batcher, so a queue full of big requests does not delay them: they are refused only at the
  request limit.

Both front ends use it the same way: `check()` before the body is read (refusal without reading
or parsing anything), then `enter()` once the body is in (a client that uploads slowly holds no
slot while it does), `leave()` when the answer is sent. A refusal is a 429 whose `Retry-After` is
the estimated queue wait (at least 1 s), answered after `pause()`: at most `refusal_delay_s`, never
longer than its Retry-After. Clients that retry at once would otherwise turn the refusals into a
storm that takes the CPU from the admitted requests; a sleeping refusal costs no CPU.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from service.errors import Overloaded

# Bodies up to this size (a few sentences) are not held back by a long queue (module docstring).
SMALL_BODY = 1024


class Admission:
    """Admits or refuses one worker's inference requests (see the module docstring)."""

    def __init__(self, limit: int, refusal_delay_s: float = 0.0, max_queue_wait_s: float = math.inf,
                 queued_seconds: Callable[[], float] = lambda: 0.0,
                 on_change: Callable[[int], None] | None = None):
        self.limit = limit
        self.refusal_delay_s = refusal_delay_s
        self.max_queue_wait_s = max_queue_wait_s
        self.queued_seconds = queued_seconds  # the batchers' estimate of the work waiting
        self.on_change = on_change  # metrics: requests in progress
        self.active = 0

    def check(self, body_bytes: int | None) -> None:
        """Raise Overloaded (429) if this request (declared size; None: unknown) is not admitted
        now; takes no slot."""
        if self.active >= self.limit:
            raise self._refusal(f"{self.active} requests in progress (limit {self.limit})")
        if body_bytes is None or body_bytes > SMALL_BODY:
            queued = self.queued_seconds()
            if queued > self.max_queue_wait_s:
                raise self._refusal(f"about {queued:.1f} s of work queued (limit "
                                    f"{self.max_queue_wait_s:g} s)", queued)

    def enter(self) -> None:
        """Take a slot (or raise Overloaded at the request limit)."""
        if self.active >= self.limit:
            raise self._refusal(f"{self.active} requests in progress (limit {self.limit})")
        self.active += 1
        if self.on_change is not None:
            self.on_change(self.active)

    def leave(self) -> None:
        """Give the slot back."""
        self.active -= 1
        if self.on_change is not None:
            self.on_change(self.active)

    async def pause(self, refusal: Overloaded) -> None:
        """Hold a refusal before it is answered (see the module docstring)."""
        delay = min(self.refusal_delay_s, float(refusal.headers.get("Retry-After", 1)))
        if delay > 0:
            await asyncio.sleep(delay)

    def _refusal(self, why: str, queued: float | None = None) -> Overloaded:
        wait = self.queued_seconds() if queued is None else queued
        return Overloaded(f"server busy: {why}", retry_after=max(1, math.ceil(wait)))
