"""Frames between the scheduler and its API worker."""

from __future__ import annotations

import asyncio
import struct

import pytest

from elastic_gpu.scheduler import ipc


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def read_all(data: bytes) -> list[object]:
    reader = reader_of(data)
    out: list[object] = []
    while (message := await ipc.read(reader)) is not None:
        out.append(message)
    return out


def test_messages_round_trip_in_order() -> None:
    messages = [["bind", 1, "ns", "p", "uid", "n1", 42, {"a": "b"}],
                ["reply", 1, None, ["409 Conflict: x", True, 409]],
                ["page", "pods", True, False, [{"metadata": {"name": "p" * 10_000}}]]]
    data = b"".join(ipc.encode(m) for m in messages)
    assert asyncio.run(read_all(data)) == messages


@pytest.mark.parametrize("data, why", [
    (ipc.encode(["event", "pods", "ADDED", {}])[:-3], "inside a frame"),
    (b"\x00\x00", "inside a frame header"),
    (struct.pack(">I", ipc.MAX_FRAME + 1), "corrupt"),
    (struct.pack(">I", 1) + b"\x07", "not a message"),
])
def test_a_broken_stream_is_an_error_not_a_message(data: bytes, why: str) -> None:
    with pytest.raises(ipc.FrameError, match=why):
        asyncio.run(read_all(data))
