"""The link and the API worker talking through real frames (`egpu_testing.workerpipe`):
each call arrives as its typed request and comes back as its reply, errors with their
definiteness and code; a message that does not decode is refused with what is wrong with it,
and neither side stops on it."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from egpu_testing.workerpipe import ApiRecorder, PipedWorker, linked
from elastic_gpu.kube.transport import ApiStatusError
from elastic_gpu.scheduler import ipc
from elastic_gpu.scheduler.handle import BindError
from elastic_gpu.scheduler.worker_link import WorkerLink


class Events:
    """A feed sink that records the events it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_event"):
            return lambda kind, obj: self.events.append((kind, obj["metadata"]["name"]))
        return lambda *args: False


POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "managedFields": [{}]},
       "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
       "status": {"phase": "Running"}}


class Linked:
    def __init__(self, api: ApiRecorder) -> None:
        self.api = api
        self.sink = Events()
        self.link = WorkerLink(None, self.sink)  # type: ignore[arg-type]
        self.process = PipedWorker(api)


@pytest.fixture
async def linked_worker() -> AsyncIterator[Linked]:
    both = Linked(ApiRecorder({
        ("GET", "/api/v1/namespaces/ns/pods/p"): json.dumps(POD).encode(),
        ("POST", "/api/v1/namespaces/ns/pods/p/binding"): b"{}",
        ("POST", "/api/v1/namespaces/ns/pods/taken/binding"):
            ApiStatusError(409, "Conflict", "pod taken is already assigned to node n2"),
    }))
    worker = asyncio.create_task(both.process.serve())
    reading = await linked(both.link, both.process)
    yield both
    both.process.stdin.close()
    await asyncio.wait_for(asyncio.gather(worker, reading), 5)


async def test_a_bind_reaches_the_api_as_the_binding_it_asked_for(
        linked_worker: Linked) -> None:
    await linked_worker.link.bind("ns", "p", "u1", "n1", 42, {"elasticgpu.io/a": "b"})
    ((method, path, body),) = linked_worker.api.requests
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/pods/p/binding")
    binding = msgspec.json.decode(body)
    assert binding["target"]["name"] == "n1"
    assert binding["metadata"] == {"name": "p", "namespace": "ns", "uid": "u1",
                                   "resourceVersion": "42",
                                   "annotations": {"elasticgpu.io/a": "b"}}


async def test_an_api_refusal_comes_back_definite_with_its_code(linked_worker: Linked) -> None:
    with pytest.raises(BindError, match="already assigned to node n2") as err:
        await linked_worker.link.bind("ns", "taken", "u2", "n1", None, {})
    assert err.value.definite and err.value.code == 409


async def test_objects_come_back_slim_and_absent_ones_as_none(linked_worker: Linked) -> None:
    pod = await linked_worker.link.get_pod("ns", "p")
    assert pod is not None and pod["metadata"]["uid"] == "u1"
    assert "managedFields" not in pod["metadata"]  # slim
    assert await linked_worker.link.get_pod("ns", "nobody") is None
    assert await linked_worker.link.get_claim("ns", "nobody") is None


async def test_a_request_of_an_unknown_feed_is_an_error_not_a_hang(
        linked_worker: Linked) -> None:
    with pytest.raises(BindError, match="no feed 'cats'"):
        await linked_worker.link.resync("cats")


async def test_a_malformed_request_is_answered_definite_with_what_is_wrong(
        linked_worker: Linked) -> None:
    link = linked_worker.link
    # a field of the wrong type (Structs are not checked when built, only when decoded)
    bad = ipc.Bind(link._next_id(), "ns", "p", "u1", "n1", "42", {})  # type: ignore[arg-type]
    with pytest.raises(BindError, match=r"malformed request: .*Expected `int \| null`") as err:
        await link._call(bad)
    assert err.value.definite  # nothing reached the API
    assert linked_worker.api.requests == []
    # the worker reads on: the next call is served
    assert await link.get_pod("ns", "p") is not None


async def test_a_malformed_worker_message_restarts_the_worker_not_the_extender(
        caplog: pytest.LogCaptureFixture) -> None:
    process = PipedWorker(ApiRecorder())
    sink = Events()
    link = WorkerLink(None, sink)  # type: ignore[arg-type]
    reading = await linked(link, process)
    process.send(ipc.Event("pods", "ADDED", {"metadata": {"name": "before"}}))
    broken = msgspec.msgpack.encode(["event", "pods", "ADDED"])
    process.send_frame(struct.pack(">I", len(broken)) + broken)
    process.send(ipc.Event("pods", "ADDED", {"metadata": {"name": "after"}}))
    with caplog.at_level(logging.ERROR):
        code = await reading  # returns: nothing raised into the extender
    assert code == -9  # the worker was killed, to be started again (`WorkerLink.run`)
    assert sink.events == [("ADDED", "before")]  # nothing after the broken message
    assert "API worker stream: not a message: Expected `array` of at least length 4" \
        in caplog.text


async def test_an_event_of_an_unknown_feed_restarts_the_worker(
        caplog: pytest.LogCaptureFixture) -> None:
    process = PipedWorker(ApiRecorder())
    link = WorkerLink(None, Events())  # type: ignore[arg-type]
    reading = await linked(link, process)
    process.send(ipc.Event("cats", "ADDED", {"metadata": {"name": "tom"}}))
    with caplog.at_level(logging.ERROR):
        assert await reading == -9
    assert "unknown feed 'cats'" in caplog.text


async def test_a_call_the_worker_does_not_answer_fails_unknown_and_a_late_answer_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_gpu.scheduler import worker_link
    monkeypatch.setattr(worker_link, "CALL_TIMEOUT_S", 0.05)
    both = Linked(ApiRecorder({("POST", "/api/v1/namespaces/ns/pods/p/binding"): b"{}"}))
    reading = await linked(both.link, both.process)  # the worker does not read its requests yet
    with pytest.raises(BindError, match="did not answer bind within") as raised:
        await both.link.bind("ns", "p", "u1", "n1", 7, {})
    assert raised.value.definite is False  # it may still land: the bind verb reads the pod
    assert both.link._pending == {}
    worker = asyncio.create_task(both.process.serve())  # now it answers, too late
    assert await both.link.get_pod("ns", "p") is None  # the next call is answered
    assert [type(m).__name__ for m in both.process.sent] == ["Reply", "Reply"]
    both.process.stdin.close()
    await asyncio.wait_for(asyncio.gather(worker, reading), 5)
