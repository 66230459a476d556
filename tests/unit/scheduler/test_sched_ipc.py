"""Frames and messages between the scheduler and its API worker (`scheduler.ipc`)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec
import pytest

from elastic_gpu.scheduler import ipc

#: One of every message, each side's.
REQUESTS: list[ipc.Request] = [
    ipc.Bind(1, "ns", "p", "uid-1", "n1", 42, {"a": "b"}),
    ipc.Bind(2, "ns", "p", "", "n1", None, {}),
    ipc.Wake(3, "ns", "p", "uid-1", "wake-up 7: GPU capacity freed on node n1"),
    ipc.Resync(4, "pods"),
    ipc.CatchUp(5, "pods", 2.5),
    ipc.GetPod(6, "ns", "p"),
    ipc.GetEgpuObject(7, "elasticgpuclaims", "ns", "c"),
    ipc.CreateElasticGpu(8, {"metadata": {"name": "e"}, "spec": {"node": "n1"}}),
]
WORKER_MESSAGES: list[ipc.WorkerMessage] = [
    ipc.Reply(1, None, None),
    ipc.Reply(2, None, ipc.RequestError("409 Conflict: x", True, 409)),
    ipc.Reply(5, "watch", None),
    ipc.Reply(6, {"metadata": {"name": "p"}, "spec": {"containers": []}}, None),
    ipc.Page("pods", True, False, [{"metadata": {"name": "p" * 10_000}}]),
    ipc.Page("nodes", True, True, []),
    ipc.Event("gpudevices", "DELETED", {"metadata": {"name": "n1-0"}}),
]


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def read_all(data: bytes, decoder: msgspec.msgpack.Decoder[Any]) -> list[object]:
    reader = reader_of(data)
    out: list[object] = []
    while (message := await ipc.read(reader, decoder)) is not None:
        out.append(message)
    return out


def test_every_message_round_trips_in_order_into_its_own_type() -> None:
    data = b"".join(ipc.encode(m) for m in REQUESTS)
    assert asyncio.run(read_all(data, ipc.REQUESTS)) == REQUESTS
    data = b"".join(ipc.encode(m) for m in WORKER_MESSAGES)
    back = asyncio.run(read_all(data, ipc.WORKER_MESSAGES))
    assert back == WORKER_MESSAGES
    assert [type(m) for m in back] == [type(m) for m in WORKER_MESSAGES]
    assert {type(m) for m in REQUESTS} == set(ipc.Request.__args__)  # none left out
    assert {type(m) for m in WORKER_MESSAGES} == set(ipc.WorkerMessage.__args__)


def test_a_message_is_its_tag_then_its_fields_as_compact_as_a_list() -> None:
    bind = ipc.encode(ipc.Bind(1, "ns", "p", "u", "n1", 42, {"a": "b"}))
    assert msgspec.msgpack.decode(bind[4:]) == ["bind", 1, "ns", "p", "u", "n1", 42, {"a": "b"}]
    reply = ipc.encode(ipc.Reply(9, None, ipc.RequestError("gone", True, 404)))
    assert msgspec.msgpack.decode(reply[4:]) == ["reply", 9, None, ["gone", True, 404]]
    assert ipc.tag(ipc.CatchUp(1, "pods", 1.0)) == "catch_up"


@pytest.mark.parametrize(("body", "why", "request_id"), [
    (["bind", 7, "ns", "p", "u", "n1", "42", {}], r"Expected `int \| null`, got `str`", 7),
    (["bind", 7, "ns", "p"], "at least length 8", 7),
    (["catch_up", 8, "pods", "soon"], r"Expected `float`, got `str` - at `\$\[3\]`", 8),
    (["delete_everything", 9], "Invalid value 'delete_everything'", 9),
    (["reply", 1, None, None], "Invalid value 'reply'", 1),  # the worker's kind, not a request
    ("bind", "Expected `array`, got `str`", None),
    (["get_pod", "7", "ns", "p"], "Expected `int`, got `str`", None),  # no id to answer
])
async def test_a_malformed_request_is_refused_with_what_is_wrong_and_its_id(
        body: object, why: str, request_id: int | None) -> None:
    frame = msgspec.msgpack.encode(body)
    reader = reader_of(struct.pack(">I", len(frame)) + frame + ipc.encode(REQUESTS[0]))
    with pytest.raises(ipc.MessageError, match=why) as err:
        await ipc.read(reader, ipc.REQUESTS)
    assert err.value.request_id == request_id
    # the frame was whole: the stream reads on past it
    assert await ipc.read(reader, ipc.REQUESTS) == REQUESTS[0]


@pytest.mark.parametrize(("body", "why"), [
    (msgspec.msgpack.encode(["page", "pods", 1, True, []]), "Expected `bool`, got `int`"),
    (msgspec.msgpack.encode(["event", "pods", "ADDED"]), "at least length 4"),
    (msgspec.msgpack.encode(["reply", 1, None, ["gone", True]]), "at least length 3"),
    (msgspec.msgpack.encode(["bind", 1, "ns", "p", "u", "n", None, {}]), "Invalid value"),
    (b"\xc1", "malformed"),
])
def test_a_malformed_worker_message_is_a_message_error(body: bytes, why: str) -> None:
    data = struct.pack(">I", len(body)) + body
    with pytest.raises(ipc.MessageError, match=why):
        asyncio.run(read_all(data, ipc.WORKER_MESSAGES))


@pytest.mark.parametrize("data, why", [
    (ipc.encode(ipc.Event("pods", "ADDED", {}))[:-3], "inside a frame"),
    (b"\x00\x00", "inside a frame header"),
    (struct.pack(">I", ipc.MAX_FRAME + 1), "corrupt"),
])
def test_a_broken_stream_is_an_error_not_a_message(data: bytes, why: str) -> None:
    with pytest.raises(ipc.FrameError, match=why) as err:
        asyncio.run(read_all(data, ipc.WORKER_MESSAGES))
    assert not isinstance(err.value, ipc.MessageError)  # the stream cannot be read on
