"""MicroBatcher with a fake runner, its scheduling: calls in flight, fairness between small and big
requests, withdrawal and abort, and the queue/inference timing it reports."""

from __future__ import annotations

import asyncio
import threading
import time
from asyncio import run

import pytest
from support_serving import FakeRunner
from support_serving import make_batcher as make

from service.common.errors import NotReady


class OverlapRunner(FakeRunner):
    """FakeRunner that also records how many calls ran at the same time."""

    def __init__(self, delay: float):
        super().__init__(delay)
        self.active = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, payloads: list) -> list:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            return super().__call__(payloads)
        finally:
            with self.lock:
                self.active -= 1


@pytest.mark.parametrize("concurrency", [1, 2, 3])
def test_concurrency_bounds_calls_in_flight(concurrency):
    from concurrent.futures import ThreadPoolExecutor

    runner = OverlapRunner(delay=0.05)
    executor = ThreadPoolExecutor(8)

    async def main():
        # A cell budget of one sentence per call: 6 sentences -> 6 calls, `concurrency` at a time.
        b = make(runner, max_batch_size=64, max_batch_cells=1, concurrency=concurrency,
                 executor=executor)
        await b.start()
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(b.run([c]) for c in "abcdef"))
        elapsed = time.perf_counter() - t0
        await b.stop()
        return outs, elapsed

    outs, elapsed = run(main())
    executor.shutdown()
    assert outs == [[c * 2] for c in "abcdef"]
    assert len(runner.batches) == 6 and runner.most == concurrency
    assert elapsed >= 0.05 * 6 / concurrency * 0.9  # never more than `concurrency` at once


def test_stop_drains_batches_in_flight_with_concurrency():
    from concurrent.futures import ThreadPoolExecutor

    runner = OverlapRunner(delay=0.03)
    executor = ThreadPoolExecutor(4)

    async def main():
        b = make(runner, max_batch_size=64, max_batch_cells=1, concurrency=2, executor=executor)
        await b.start()
        pending = asyncio.ensure_future(b.run(list("abcde")))
        await asyncio.sleep(0.01)
        await b.stop()
        return await pending

    assert run(main()) == ["aa", "bb", "cc", "dd", "ee"]
    executor.shutdown()
    assert runner.most == 2


def test_a_small_request_is_interleaved_with_a_big_one():
    """Fairness: a one-item request that arrives while a 40-item request waits runs in the next
    call, not after the big request's whole queue (FIFO made it wait for all 40 calls)."""
    runner = FakeRunner(delay=0.01)

    async def main():
        # One item per call (cells budget) so every call is one sentence.
        b = make(runner, max_batch_size=64, max_wait_ms=0, max_batch_cells=1)
        await b.start()
        big = asyncio.ensure_future(b.run([f"big{i:02d}" for i in range(40)]))
        await asyncio.sleep(0.03)  # the big request's first calls are running
        small = await b.run(["s"])
        calls_before_small = next(i for i, batch in enumerate(runner.batches) if batch == ["s"])
        out = await big
        await b.stop()
        return small, calls_before_small, out

    small, calls_before_small, out = run(main())
    assert small == ["ss"] and out == [f"big{i:02d}" * 2 for i in range(40)]
    assert calls_before_small <= 6, calls_before_small  # FIFO: 40


def test_equal_requests_keep_their_arrival_order():
    """Requests of equal size are served in arrival order, each call filled from as few requests
    as possible (a round-robin would make every one of them finish late)."""
    runner = FakeRunner()
    runner.gate = threading.Event()

    async def main():
        b = make(runner, max_batch_size=2, max_wait_ms=0, max_batch_cells=10**9)
        await b.start()
        first = asyncio.ensure_future(b.run(["x0"]))  # occupies the worker (gate closed)
        await asyncio.sleep(0.05)
        reqs = [asyncio.ensure_future(b.run([f"{r}{i}" for i in range(3)])) for r in "abc"]
        await asyncio.sleep(0.01)
        runner.gate.set()
        await first
        out = await asyncio.gather(*reqs)
        await b.stop()
        return out

    out = run(main())
    assert out == [[f"{r}{i}" * 2 for i in range(3)] for r in "abc"]
    assert runner.batches[1:] == [["a0", "a1"], ["a2", "b0"], ["b1", "b2"], ["c0", "c1"], ["c2"]]


def test_a_big_request_is_not_starved_by_small_ones():
    """Every OLDEST_EVERY-th call serves the oldest request first, so a steady stream of
    one-sentence requests cannot hold a big request back (fewest-left-first alone would)."""
    from service.backend.batcher import OLDEST_EVERY

    runner = FakeRunner(delay=0.005)

    async def main():
        b = make(runner, max_batch_size=64, max_wait_ms=0, max_batch_cells=1)
        await b.start()
        big = asyncio.ensure_future(b.run([f"big{i}" for i in range(10)]))
        stop = time.perf_counter() + 5

        async def small_stream() -> None:
            while not big.done() and time.perf_counter() < stop:
                await asyncio.gather(*(b.run(["s"]) for _ in range(3)))

        await asyncio.gather(small_stream(), small_stream())
        out = await big
        await b.stop()
        return out

    assert run(main()) == [f"big{i}" * 2 for i in range(10)]
    calls = runner.batches
    last_big = max(i for i, batch in enumerate(calls) if batch[0].startswith("big"))
    assert last_big < 10 * OLDEST_EVERY + 4, last_big  # the small ones go on for longer


def test_withdrawn_requests_stop_counting_at_once():
    runner = FakeRunner()
    runner.gate = threading.Event()

    async def main():
        b = make(runner, max_batch_size=1, max_wait_ms=0, max_batch_cells=10**9, queue_limit=4)
        await b.start()
        first = asyncio.ensure_future(b.run(["first"]))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(b.run(["g1", "g2", "g3", "g4"]))  # fills the queue
        await asyncio.sleep(0.01)
        assert b.depth == 4
        gone.cancel()
        await asyncio.sleep(0.01)
        depth_after = b.depth
        kept = asyncio.ensure_future(b.run(["k1", "k2", "k3", "k4"]))  # fits again at once
        runner.gate.set()
        res = await asyncio.gather(first, kept)
        await b.stop()
        return depth_after, res

    depth_after, res = run(main())
    assert depth_after == 0 and res == [["firstfirst"], ["k1k1", "k2k2", "k3k3", "k4k4"]]
    assert not any(p.startswith("g") for batch in runner.batches for p in batch)


def test_abort_answers_queued_and_running_items_at_once():
    runner = FakeRunner()
    runner.gate = threading.Event()

    async def main():
        b = make(runner, max_batch_size=1, max_wait_ms=0, max_batch_cells=10**9)
        await b.start()
        running = asyncio.ensure_future(b.run(["r"]))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(b.run(["q1", "q2"]))
        await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        told = b.abort(NotReady("shutting down"))
        outcomes = await asyncio.gather(running, queued, return_exceptions=True)
        waited = time.perf_counter() - t0
        runner.gate.set()  # the call still running finishes later; nobody waits for it
        await b.stop(timeout=5)
        with pytest.raises(NotReady):
            await b.run(["late"])
        return told, outcomes, waited

    told, outcomes, waited = run(main())
    assert told == 3 and all(isinstance(o, NotReady) for o in outcomes) and waited < 1.0


def test_run_reports_queue_and_inference_time():
    from service.common.timing import RequestTiming

    runner = FakeRunner(delay=0.03)

    async def main():
        b = make(runner, max_batch_size=1, max_wait_ms=0, max_batch_cells=10**9)
        await b.start()
        ahead = asyncio.ensure_future(b.run(["first"]))
        await asyncio.sleep(0)
        timing = RequestTiming()
        await b.run(["a", "b"], timing)
        await ahead
        await b.stop()
        return timing

    timing = run(main())
    assert timing.inferred
    assert 0.02 <= timing.queue_s < 1.0  # waited for "first"'s call
    assert 0.05 <= timing.inference_s < 1.0  # two calls of 30 ms


def test_a_traced_request_records_its_queue_and_each_call_it_shared():
    """With `stages` (a traced request, service.http.tracing) `run` adds one queue stage and one
    inference stage per call that ran its items: the call's size counts every request's rows, the
    request's rows and tokens its own; requests batched together name the same call. Untraced,
    nothing is recorded."""
    from service.common.timing import RequestTiming

    runner = FakeRunner(delay=0.01)
    texts = [["aaaa", "bb"], ["c", "ddd"], ["e"]]

    async def main():
        b = make(runner, max_batch_size=3, max_wait_ms=100, max_batch_cells=10**9)
        await b.start()
        traced = [RequestTiming(stages=[]) for _ in texts]
        plain = RequestTiming()
        await asyncio.gather(*(b.run(t, timing) for t, timing in zip(texts, traced, strict=True)),
                             b.run(["f"], plain))
        await b.stop()
        return traced, plain

    traced, plain = run(main())
    assert plain.stages is None and plain.inferred
    assert traced[0].stages[0].attributes == {"disan.graph": "test", "disan.rows": 2}
    calls: dict[str, list[dict]] = {}
    for request, timing in zip(texts, traced, strict=True):
        queue, *inference = timing.stages
        assert queue.name == "queue" and inference and all(s.name == "inference" for s in inference)
        assert queue.start <= queue.end == min(s.start for s in inference)
        assert sum(s.attributes["disan.rows"] for s in inference) == len(request)
        assert sum(s.attributes["disan.tokens"] for s in inference) == sum(map(len, request))
        for s in inference:
            assert s.start < s.end and s.attributes["disan.graph"] == "test"
            calls.setdefault(s.attributes["disan.batch.id"], []).append(s.attributes)
    assert len(calls) == len(runner.batches) == 2  # 6 rows, 3 a call
    assert any(len(attrs) > 1 for attrs in calls.values())  # a call shared by two requests
    for attrs in calls.values():
        size = attrs[0]["disan.batch.size"]
        assert size == 3 and {a["disan.batch.size"] for a in attrs} == {size}
        assert sum(a["disan.rows"] for a in attrs) <= size <= attrs[0]["disan.batch.padded_tokens"]


def test_a_small_request_runs_in_the_next_call_while_the_old_big_one_progresses():
    """A one-sentence request never waits for more than the call in flight while the oldest
    request is being served anyway: the oldest-first turn is only forced on a request that
    went OLDEST_EVERY calls without an item (a fixed every-4th turn made one probe in four wait
    a second call behind long documents: the p99 of bench/chaos.py's long+small)."""
    runner = FakeRunner(delay=0.005)
    probes_at: list[int] = []  # call index during which each probe was submitted

    async def main():
        loop = asyncio.get_running_loop()
        b = make(runner, max_batch_size=64, max_wait_ms=0, max_batch_cells=1)
        probes: list[asyncio.Future] = []

        def submit_probe(at: int) -> None:
            probes_at.append(at)
            probes.append(asyncio.ensure_future(b.run([f"p{at:02d}"])))

        def recording(payloads: list) -> list:
            out = runner(payloads)
            call = len(runner.batches) - 1
            if payloads[0].startswith("big") and 1 <= call <= 24 and call % 3 == 1:
                loop.call_soon_threadsafe(submit_probe, call)  # queued before the next call
            return out

        b.runner = recording
        await b.start()
        big = await b.run([f"big{i:02d}" for i in range(40)])
        await asyncio.gather(*probes)
        await b.stop()
        return big

    assert run(main()) == [f"big{i:02d}" * 2 for i in range(40)]
    waited = {at: next(i for i, batch in enumerate(runner.batches) if batch == [f"p{at:02d}"]) - at
              for at in probes_at}
    assert len(waited) >= 6, waited
    assert set(waited.values()) == {1}, waited  # each probe in the call right after its arrival
