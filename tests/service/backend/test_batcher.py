"""MicroBatcher with a fake runner: coalescing, deadline, cell budget, errors, cancellation, 429, order."""

from __future__ import annotations

import asyncio
import threading
import time
from asyncio import run

import pytest
from support_serving import FakeRunner
from support_serving import make_batcher as make

from disan.runtime.batching import split_by_cells
from service.common.errors import NotReady, Overloaded


def test_split_by_cells_respects_budget_and_size():
    lengths = [1, 2, 2, 3, 8, 8, 16]
    parts = split_by_cells(lengths, max_cells=64, max_size=3)
    assert [i for p in parts for i in p] == list(range(len(lengths)))  # contiguous, complete
    for p in parts:
        size, longest = len(p), max(lengths[i] for i in p)
        assert size <= 3
        assert size * longest**2 <= 64 or size == 1  # a lone over-budget item still runs
    assert [len(p) for p in parts] == [3, 1, 1, 1, 1]


def test_coalesces_concurrent_requests_into_one_batch():
    runner = FakeRunner()

    async def main():
        b = make(runner, max_batch_size=64, max_wait_ms=50, max_batch_cells=10**9)
        await b.start()
        results = await asyncio.gather(*(b.run(["x" * (i + 1)]) for i in range(10)))
        await b.stop()
        return results

    results = run(main())
    assert [r[0] for r in results] == ["x" * (i + 1) * 2 for i in range(10)]
    assert len(runner.batches) == 1 and len(runner.batches[0]) == 10


def test_max_batch_size_caps_each_call():
    runner = FakeRunner()

    async def main():
        b = make(runner, max_batch_size=4, max_wait_ms=50, max_batch_cells=10**9)
        await b.start()
        out = await b.run(["ab"] * 10)
        await b.stop()
        return out

    assert run(main()) == ["abab"] * 10
    assert all(len(batch) <= 4 for batch in runner.batches)
    assert sum(len(batch) for batch in runner.batches) == 10


def test_deadline_flushes_a_partial_batch():
    runner = FakeRunner()

    async def main():
        b = make(runner, max_batch_size=1000, max_wait_ms=30, max_batch_cells=10**9)
        await b.start()
        t0 = time.perf_counter()
        out = await b.run(["a"])
        elapsed = time.perf_counter() - t0
        await b.stop()
        return out, elapsed

    out, elapsed = run(main())
    assert out == ["aa"]
    assert 0.025 <= elapsed < 1.0  # waited for the deadline, not for a full batch


def test_cell_budget_splits_and_sorts_by_length():
    runner = FakeRunner()
    texts = ["x" * n for n in (10, 1, 10, 2, 1, 10)]

    async def main():
        b = make(runner, max_batch_size=64, max_wait_ms=20, max_batch_cells=250)
        await b.start()
        out = await b.run(texts)
        await b.stop()
        return out

    assert run(main()) == [t * 2 for t in texts]  # request order kept
    for batch in runner.batches:
        assert len(batch) * max(len(t) for t in batch) ** 2 <= 250
        assert [len(t) for t in batch] == sorted(len(t) for t in batch)
    assert len(runner.batches) >= 2
    assert runner.batches[0] == ["x", "x", "xx"]  # short ones together, padding stays small


def test_exception_reaches_every_waiter_and_worker_survives():
    runner = FakeRunner(fail_when=lambda ps: "bad" in ps)

    async def main():
        b = make(runner, max_batch_size=64, max_wait_ms=30, max_batch_cells=10**9)
        await b.start()
        outcomes = await asyncio.gather(b.run(["bad"]), b.run(["ok"]), b.run(["fine", "x"]),
                                        return_exceptions=True)
        after = await b.run(["later"])  # the worker is still alive
        await b.stop()
        return outcomes, after

    outcomes, after = run(main())
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    assert after == ["laterlater"]


def test_cancelled_requests_are_skipped():
    runner = FakeRunner()
    runner.gate = threading.Event()

    async def main():
        b = make(runner, max_batch_size=1, max_wait_ms=0, max_batch_cells=10**9)
        await b.start()
        first = asyncio.ensure_future(b.run(["first"]))  # occupies the worker (gate closed)
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(b.run(["gone"]))
        await asyncio.sleep(0.01)
        gone.cancel()
        kept = asyncio.ensure_future(b.run(["kept"]))
        await asyncio.sleep(0.01)
        runner.gate.set()
        res = await asyncio.gather(first, kept)
        await b.stop()
        return res

    assert run(main()) == [["firstfirst"], ["keptkept"]]
    assert ["gone"] not in runner.batches


def test_queue_full_raises_overloaded_at_once():
    runner = FakeRunner()
    runner.gate = threading.Event()

    async def main():
        b = make(runner, max_batch_size=2, max_wait_ms=0, max_batch_cells=10**9, queue_limit=3)
        await b.start()
        busy = asyncio.ensure_future(b.run(["a", "b"]))  # taken by the worker, blocked in runner
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(b.run(["c", "d", "e"]))  # fills the queue
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as info:
            await b.run(["f"])
        runner.gate.set()
        out = await asyncio.gather(busy, waiting)
        await b.stop()
        return info.value, out

    err, out = run(main())
    assert err.status == 429 and int(err.headers["Retry-After"]) >= 1
    assert out == [["aa", "bb"], ["cc", "dd", "ee"]]


def test_results_follow_request_order_under_concurrency():
    runner = FakeRunner()

    async def main():
        b = make(runner, max_batch_size=8, max_wait_ms=5, max_batch_cells=200)
        await b.start()
        reqs = [[f"{r}-" + "y" * ((r * 7 + i * 3) % 13 + 1) for i in range(r % 5 + 1)] for r in range(30)]
        outs = await asyncio.gather(*(b.run(req) for req in reqs))
        await b.stop()
        return reqs, outs

    reqs, outs = run(main())
    for req, out in zip(reqs, outs, strict=True):
        assert out == [t * 2 for t in req]


def test_stop_drains_then_refuses():
    runner = FakeRunner(delay=0.02)

    async def main():
        b = make(runner, max_batch_size=2, max_wait_ms=0, max_batch_cells=10**9)
        await b.start()
        pending = asyncio.ensure_future(b.run(["a", "b", "c", "d", "e"]))
        await asyncio.sleep(0)
        await b.stop()
        with pytest.raises(NotReady):
            await b.run(["late"])
        return await pending

    assert run(main()) == ["aa", "bb", "cc", "dd", "ee"]
