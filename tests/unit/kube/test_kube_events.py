"""The Event recorder: de-duplication within the window, never blocking or failing the caller."""

from __future__ import annotations

import asyncio
from typing import Any

from egpu_testing.clock import ManualClock
from elastic_gpu.kube.errors import Forbidden, NotFound
from elastic_gpu.kube.events import WARNING, EventRecorder

CLAIM = {"apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPUClaim",
         "metadata": {"name": "c", "namespace": "ns", "uid": "u1"}}
EGPU = {"apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPU",
        "metadata": {"name": "e", "uid": "u2"}}


class FakeClient:
    def __init__(self, fail: Exception | None = None) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.fail = fail

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.events[f"{path}/{obj['metadata']['name']}"] = dict(obj)
        return obj

    async def patch(self, path: str, patch: dict[str, Any], content_type: str = "") -> dict[str, Any]:
        if path not in self.events:
            raise NotFound(404, "NotFound", "gone")
        self.events[path].update(patch)
        return self.events[path]


async def run(recorder: EventRecorder) -> None:
    task = asyncio.create_task(recorder.run())
    await asyncio.wait_for(recorder.flush(), 5)
    task.cancel()


async def test_same_event_bumps_count_instead_of_a_new_object() -> None:
    client = FakeClient()
    recorder = EventRecorder(client, "egpu-controller", "me")  # type: ignore[arg-type]
    for _ in range(3):
        recorder.record(CLAIM, WARNING, "ProvisioningFailed", "0/4 nodes can host it")
    recorder.record(CLAIM, WARNING, "ProvisioningFailed", "another message")
    recorder.record(EGPU, "Normal", "Released", "claim ns/c was deleted")
    await run(recorder)
    events = list(client.events.values())
    assert len(events) == 3
    first = next(e for e in events if e["message"] == "0/4 nodes can host it")
    assert first["count"] == 3 and first["type"] == WARNING
    assert first["involvedObject"] == {"apiVersion": "elasticgpu.io/v1alpha",
                                       "kind": "ElasticGPUClaim", "name": "c", "uid": "u1",
                                       "namespace": "ns"}
    assert first["metadata"]["namespace"] == "ns"
    released = next(e for e in events if e["reason"] == "Released")
    assert released["metadata"]["namespace"] == "default"  # a cluster-scoped object's
    assert (recorder.created, recorder.bumped) == (3, 2)


async def test_outside_the_window_a_new_event_is_made() -> None:
    client, clock = FakeClient(), ManualClock()
    recorder = EventRecorder(client, "c", dedup_window_s=60.0,  # type: ignore[arg-type]
                             clock=clock)
    recorder.record(CLAIM, WARNING, "Lost", "x")
    await run(recorder)
    clock.advance(60)  # the window's last instant: still the same event
    recorder.record(CLAIM, WARNING, "Lost", "x")
    await run(recorder)
    assert len(client.events) == 1
    clock.advance(60.5)  # past the window counted from the last one
    recorder.record(CLAIM, WARNING, "Lost", "x")
    await run(recorder)
    assert len(client.events) == 2 and recorder.bumped == 1


async def test_failures_and_a_full_queue_never_reach_the_caller() -> None:
    client = FakeClient(fail=Forbidden(403, "Forbidden", "no"))
    recorder = EventRecorder(client, "c", max_queued=2)  # type: ignore[arg-type]
    for i in range(5):
        recorder.record(CLAIM, WARNING, "R", str(i))  # no raise, no wait
    assert recorder.dropped == 3
    await run(recorder)
    assert recorder.dropped == 5 and client.events == {}
