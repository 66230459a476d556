"""Frames between the scheduler process and its API worker: a 4-byte length, then msgpack.

Messages are lists, their first element the kind:
  scheduler -> worker  ["bind", id, namespace, name, uid, node, resourceVersion|None, annotations]
                       ["get_pod", id, namespace, name]
                       ["wake", id, namespace, name, uid, message]  set the pending pod's
                                                    wake-up condition (`apiworker.wakeup_patch`)
  worker -> scheduler  ["reply", id, result, error]     error: [message, definite, code] | None
                       ["page", feed, first, last, [object, ...]]  a (re)list, page by
                                                    page: `first` begins it (an unfinished
                                                    one is void), the pages from it to
                                                    `last` are exactly what exists
                       ["event", feed, type, object]    ADDED / MODIFIED / DELETED
Feeds are "nodes", "gpudevices" and "pods"; objects are `slim` dicts.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

_HEADER = struct.Struct(">I")
#: A page of a list (500 slim objects) is far below this; a bigger frame means a broken
#: stream.
MAX_FRAME = 1 << 30

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class FrameError(RuntimeError):
    """The other side sent something that is not a frame."""


def encode(message: list[Any]) -> bytes:
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


async def read(reader: asyncio.StreamReader) -> list[Any] | None:
    """The next message, or None at a clean end of stream."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise FrameError("stream ended inside a frame header") from None
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes announced; the stream is corrupt")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("stream ended inside a frame") from None
    message = _decoder.decode(body)
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise FrameError(f"not a message: {message!r:.100}")
    return message
