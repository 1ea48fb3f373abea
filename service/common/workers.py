"""Readiness across uvicorn worker processes: `/ready` is 200 only when every worker is ready.

With `--workers N` a load balancer's probe lands on any one worker, so a worker answering for
itself alone would say 200 while another still loads (or was killed and is being replaced). Each
worker drops a marker file named after its pid into a directory they share (`disan serve` creates
it with the metrics directory) when its model is warm and removes it when it drains; a worker is
ready for the probe when N markers of live processes exist.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerReadiness:
    """Ready markers of the workers sharing `directory` (None: one worker, nothing to share)."""

    def __init__(self, directory: Path | None, expected: int):
        self.directory = directory / "ready" if directory is not None else None
        self.expected = expected
        self.pid = os.getpid()

    def mark_ready(self) -> None:
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / str(self.pid)).touch()

    def mark_gone(self) -> None:
        if self.directory is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / str(self.pid)).unlink()

    def ready_workers(self) -> int:
        """Live workers that say they are ready."""
        if self.directory is None:
            return 1
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        return sum(1 for name in names if name.isdigit() and process_alive(int(name)))

    def all_ready(self) -> tuple[bool, str | None]:
        """(every worker ready, why not)."""
        if self.directory is None:
            return True, None
        ready = self.ready_workers()
        if ready >= self.expected:
            return True, None
        return False, f"{ready} of {self.expected} workers ready"
