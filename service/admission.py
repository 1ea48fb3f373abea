"""Admission control: refuse work the worker cannot start soon, before any of it is done.

Under overload the expensive part of a request is not the refusal but what comes before it
(reading, parsing and tokenizing a body only to find the queue full), so an inference request is
admitted or refused on arrival, from a counter: at most `limit` inference requests are in
progress per worker. The batcher interleaves the admitted requests (service.batcher), so the
limit also bounds how long each of them waits; a refused one gets 429 with a `Retry-After` of
the recent time a request spent in progress.

Both front ends use it the same way: `check()` before the body is read (refusal without reading
or parsing anything), then `enter()` once the body is in (a client that uploads slowly holds no
slot while it does), `leave()` when the answer is sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from service.errors import Overloaded


class Admission:
    """In-progress inference requests of one worker, bounded by `limit`."""

    def __init__(self, limit: int, on_change: Callable[[int], None] | None = None):
        self.limit = limit
        self.active = 0
        self.on_change = on_change  # metrics: requests in progress
        self._seconds = 0.05  # moving average of the time an admitted request is in progress

    def check(self) -> None:
        """Raise Overloaded (429) if no slot is free now; takes none."""
        if self.active >= self.limit:
            raise self._refusal()

    def enter(self) -> float:
        """Take a slot (or raise Overloaded); returns the start time for `leave`."""
        if self.active >= self.limit:
            raise self._refusal()
        self.active += 1
        if self.on_change is not None:
            self.on_change(self.active)
        return time.perf_counter()

    def leave(self, started: float) -> None:
        """Give the slot back."""
        self.active -= 1
        if self.on_change is not None:
            self.on_change(self.active)
        self._seconds = 0.9 * self._seconds + 0.1 * (time.perf_counter() - started)

    def retry_after(self) -> int:
        """Whole seconds until a slot is likely free (at least 1: the header's unit)."""
        return max(1, math.ceil(self._seconds))

    def _refusal(self) -> Overloaded:
        return Overloaded(f"server busy: {self.active} requests in progress (limit {self.limit})",
                          retry_after=self.retry_after())
