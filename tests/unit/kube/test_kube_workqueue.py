"""The work queue: dedup, one worker per key, re-add while processing, per-key backoff."""

from __future__ import annotations

import asyncio

import pytest

from elastic_gpu.kube.workqueue import ExponentialBackoff, WorkQueue


def test_backoff_doubles_per_key_up_to_max_and_forget_resets() -> None:
    b: ExponentialBackoff[str] = ExponentialBackoff(0.005, 0.05)
    assert [b.when("a") for _ in range(6)] == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05]
    assert b.when("b") == 0.005  # per key
    assert b.failures("a") == 6
    b.forget("a")
    assert b.failures("a") == 0 and b.when("a") == 0.005
    for _ in range(200):
        b.when("c")
    assert b.when("c") == 0.05  # no overflow after many failures


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="need 0 < base <= max"):
        ExponentialBackoff(0.0, 1.0)
    with pytest.raises(ValueError):
        ExponentialBackoff(2.0, 1.0)


async def test_a_waiting_key_is_queued_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a", "b"):
        q.add(key)
    assert len(q) == 2
    assert [await q.get(), await q.get()] == ["a", "b"]


async def test_a_key_is_never_processed_by_two_workers_and_readded_runs_after() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    assert key == "a"
    q.add("a")  # changed while being processed
    assert len(q) == 0  # not handed to another worker now
    other = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not other.done()
    q.done("a")  # ... but queued again once done
    assert await asyncio.wait_for(other, 1) == "a"


async def test_concurrent_workers_never_overlap_on_a_key() -> None:
    q: WorkQueue[int] = WorkQueue()
    active: set[int] = set()
    overlaps: list[int] = []
    processed: list[int] = []

    async def worker() -> None:
        while (key := await q.get()) is not None:
            if key in active:
                overlaps.append(key)
            active.add(key)
            await asyncio.sleep(0.001)
            active.discard(key)
            processed.append(key)
            q.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for _ in range(20):
        for key in range(5):
            q.add(key)
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0.1)
    q.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), 1)
    assert overlaps == []
    assert set(processed) == set(range(5))


async def test_rate_limited_add_waits_its_backoff_and_earliest_add_after_wins() -> None:
    q: WorkQueue[str] = WorkQueue(ExponentialBackoff(0.05, 1.0))
    assert q.add_rate_limited("a") == 0.05
    assert q.num_requeues("a") == 1
    assert len(q) == 0
    await asyncio.sleep(0.1)
    assert len(q) == 1 and await q.get() == "a"
    q.done("a")
    q.add_after("b", 5.0)
    q.add_after("b", 0.01)  # earlier wins
    q.add_after("b", 3.0)   # later is ignored
    assert await asyncio.wait_for(q.get(), 1) == "b"
    q.forget("a")
    assert q.num_requeues("a") == 0


async def test_shutdown_wakes_waiting_workers_with_none() -> None:
    q: WorkQueue[str] = WorkQueue()
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0.01)
    q.shutdown()
    assert await asyncio.wait_for(asyncio.gather(*getters), 1) == [None, None, None]
    q.add("a")
    assert len(q) == 0
