"""Backpressure from binds to filters (`handle.BindsInFlight.room`): kube-scheduler starts the
next pod's cycle while its binds run in goroutines, so with one round trip a pod it outran the
API's binds on a loaded box (docs/benchmarks.md, issue 39); a filter waits while the binds in
progress reach the backlog, at most `FILTER_WAIT_S`."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.handle import BIND_BACKLOG, BindsInFlight

NODES = [Node(f"n{i}", 64_000, 256_000, (Card(0, f"GPU-{i}", "A100", 16384),)) for i in range(2)]


async def test_room_waits_while_the_backlog_is_full_and_returns_once_a_bind_ends() -> None:
    binds = BindsInFlight(backlog=2)
    assert await binds.room(0.01)
    with ExitStack() as stack:
        stack.enter_context(binds.running())
        assert await binds.room(0.01)  # one of two: room
        second = ExitStack()
        second.enter_context(binds.running())
        assert not await binds.room(0.05)  # full: waited the whole timeout
        waiting = asyncio.create_task(binds.room(5.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        second.close()  # a bind ends: the waiting filter goes on at once
        assert await asyncio.wait_for(waiting, 1.0)
    assert binds.count == 0 and await binds.drained(0.01)


async def test_a_filter_waits_for_room_among_the_binds_in_flight() -> None:
    extender = Extender(ready_state(NODES))
    body = {"Pod": pod_manifest("p", uid="u", limits={"nvidia.com/gpu": "1"}),
            "Nodes": None, "NodeNames": ["n0", "n1"]}
    async with TestClient(TestServer(extender.app())) as client:
        with ExitStack() as held:
            for _ in range(BIND_BACKLOG):
                held.enter_context(extender.handle.binds.running())

            async def post() -> Any:
                response = await client.post("/filter", data=json.dumps(body))
                return await response.json()

            answer = asyncio.create_task(post())
            await asyncio.sleep(0.3)
            assert not answer.done()  # held while the backlog is full
        assert (await asyncio.wait_for(answer, 5.0))["NodeNames"]
        # and with room, at once
        assert (await asyncio.wait_for(post(), 5.0))["NodeNames"]
