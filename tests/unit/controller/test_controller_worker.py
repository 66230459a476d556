"""The one worker loop every controller runs (`controller/worker.py`): what each outcome does
to the key (forgotten, resynced, backed off) and how it is counted."""

from __future__ import annotations

import asyncio

from elastic_gpu.controller.manager import Metrics
from elastic_gpu.controller.worker import Done, Outcome, Retry, run_rounds, work
from elastic_gpu.kube.errors import Conflict
from elastic_gpu.kube.workqueue import WorkQueue


def _count(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "elasticgpu_controller_reconciles_total", {"controller": "c", "result": result})
    return value or 0.0


def _run(outcomes: dict[str, list[Outcome | Exception]], keys: list[str]
         ) -> tuple[Metrics, WorkQueue[str], list[str]]:
    metrics = Metrics()
    seen: list[str] = []

    async def scenario() -> WorkQueue[str]:
        queue: WorkQueue[str] = WorkQueue()

        async def handle(key: str) -> Outcome:
            seen.append(key)
            outcome = outcomes[key].pop(0)
            if not outcomes[key] and all(not v for v in outcomes.values()):
                loop.call_later(0.05, queue.shutdown)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        loop = asyncio.get_running_loop()
        for key in keys:
            queue.add(key)
        await asyncio.wait_for(work(queue, "c", metrics, handle, expected=(Conflict,)), 30)
        return queue

    queue = asyncio.run(scenario())
    return metrics, queue, seen


def test_done_forgets_and_a_resync_brings_the_key_back() -> None:
    metrics, _, seen = _run({"a": [Done(after=0.01), Done()]}, ["a"])
    assert seen == ["a", "a"]  # handled, then again after its resync delay
    assert _count(metrics, "ok") == 2


def test_expected_errors_and_partial_rounds_are_requeued_unexpected_ones_are_errors() -> None:
    metrics, queue, seen = _run(
        {"a": [Conflict(409, "Conflict", "stale"), Retry("1 item failed"), RuntimeError("bug"),
               Done()]}, ["a"])
    assert seen == ["a"] * 4  # every failure came back after its backoff
    assert _count(metrics, "requeue") == 2 and _count(metrics, "error") == 1
    assert _count(metrics, "ok") == 1
    assert queue.backoff.failures("a") == 0  # the success forgot the failures


def test_a_round_controller_rounds_when_on_and_is_never_woken_when_off() -> None:
    """`run_rounds`, the loop of the controllers that work in rounds (defrag, the MIG adapter,
    mig-dynamic): on, a first round at once, then each kick; off, nothing until cancelled."""
    metrics = Metrics()
    rounds: list[str] = []

    async def scenario(off: str | None) -> None:
        queue: WorkQueue[str] = WorkQueue()

        async def handle(key: str) -> Outcome:
            rounds.append(key)
            asyncio.get_running_loop().call_later(0.01, queue.shutdown)
            return Done()

        task = asyncio.ensure_future(run_rounds(queue, "c", metrics, handle,
                                                lambda: queue.add("round"),
                                                describe="a round", off=off))
        await asyncio.wait([task], timeout=0.5)
        if off is not None:
            assert not task.done()  # waiting, never woken
            task.cancel()
        else:
            assert task.done() and task.exception() is None

    asyncio.run(scenario("c: off"))
    assert rounds == []
    asyncio.run(scenario(None))
    assert rounds == ["round"]

