"""The messages between the scheduler process and its API worker, and their frames: a 4-byte
length, then msgpack.

Each message is a `msgspec.Struct`, tagged and array-like: on the wire it is a list whose
first element is its tag (``["bind", id, namespace, ...]``), and each side decodes it into
the union it reads (`Request` in the worker, `WorkerMessage` in the scheduler), so a field
of the wrong type or a missing one is refused at the edge (`MessageError`) instead of
failing somewhere behind it.

  scheduler -> worker  `Request`: `Bind`, `Wake`, `Resync`, `CatchUp`, `GetPod`,
                       `GetEgpuObject`, `CreateElasticGpu`; each numbered by its `id`
  worker -> scheduler  `Reply` (to the request of the same `id`), `Page` (one page of a
                       feed's (re)list), `Event` (one watch event of a feed)
Feeds are "nodes", "gpudevices", "pods", "elasticgpus", "elasticgpuclaims" and
"elasticgpuclasses" (`apiworker.FEEDS`); objects are `slim` dicts.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TypeVar

import msgspec

from elastic_gpu.scheduler.slim import Obj

T = TypeVar("T")

_HEADER = struct.Struct(">I")
#: A page of a list (500 slim objects) is far below this; a bigger frame means a broken
#: stream.
MAX_FRAME = 1 << 30


class _Message(msgspec.Struct, array_like=True, tag_field="kind"):
    """Array-like: the tag then the fields in order, as compact as a plain list. (The tag
    field's name never reaches the wire; "kind" only keeps it from clashing with
    `Event.type`.)"""


# ---- scheduler -> worker --------------------------------------------------------------


class Bind(_Message, tag="bind"):
    """Bind a pod to `node` (pods/<name>/binding, `apiworker.binding_body`); `uid` and
    `resource_version` are the API's preconditions, `annotations` land in the same write."""

    id: int
    namespace: str
    name: str
    uid: str
    node: str
    resource_version: int | None
    annotations: dict[str, str]


class Wake(_Message, tag="wake"):
    """Set the pending pod's wake-up condition (`apiworker.wakeup_patch`)."""

    id: int
    namespace: str
    name: str
    uid: str
    message: str


class Resync(_Message, tag="resync"):
    """List `feed` again; the reply comes once that list has been sent."""

    id: int
    feed: str


class CatchUp(_Message, tag="catch_up"):
    """Reply once every change of `feed` the API held has been sent: "watch" or "relist"
    (`apiworker.Worker.catch_up`)."""

    id: int
    feed: str
    wait_s: float


class GetPod(_Message, tag="get_pod"):
    """The pod, slim, or None if it does not exist."""

    id: int
    namespace: str
    name: str


class GetEgpuObject(_Message, tag="get_egpu_object"):
    """An Elastic GPU API object of `plural`, slim, or None if it does not exist; `namespace`
    is "" for a cluster-scoped one."""

    id: int
    plural: str
    namespace: str
    name: str


class CreateElasticGpu(_Message, tag="create_elasticgpu"):
    """Create this ElasticGPU; the reply is the created object, slim."""

    id: int
    obj: Obj


Request = Bind | Wake | Resync | CatchUp | GetPod | GetEgpuObject | CreateElasticGpu
#: The requests that write to the API (a standby replica sends none: `worker_link`).
WRITES = (Bind, Wake, CreateElasticGpu)


# ---- worker -> scheduler --------------------------------------------------------------


class RequestError(msgspec.Struct, array_like=True):
    """Why a request failed. `definite`: it certainly did not take effect (the API refused
    it, or it was never sent); otherwise it may have. `code`: the API's HTTP status, 0 if
    none."""

    message: str
    definite: bool
    code: int


#: What a request answers: a slim object, a word ("watch"/"relist"), or nothing.
Result = Obj | str | None


class Reply(_Message, tag="reply"):
    """The answer to the request numbered `id`: `result`, or `error` if it failed."""

    id: int
    result: Result
    error: RequestError | None


class Page(_Message, tag="page"):
    """One page of a feed's (re)list: `first` begins it (an unfinished one is void), and the
    pages from it to `last` are exactly what exists."""

    feed: str
    first: bool
    last: bool
    items: list[Obj]


class Event(_Message, tag="event"):
    """One watch event of a feed: `type` is ADDED, MODIFIED or DELETED."""

    feed: str
    type: str
    object: Obj


WorkerMessage = Reply | Page | Event

_encoder = msgspec.msgpack.Encoder()
#: Each side decodes only what the other sends.
REQUESTS: msgspec.msgpack.Decoder[Request] = msgspec.msgpack.Decoder(Request)
WORKER_MESSAGES: msgspec.msgpack.Decoder[WorkerMessage] = msgspec.msgpack.Decoder(WorkerMessage)
_untyped = msgspec.msgpack.Decoder()


class FrameError(RuntimeError):
    """The other side sent something that is not a frame: the stream is broken."""


class MessageError(FrameError):
    """A whole frame that is not a message of the expected kinds. The stream itself is
    intact; `request_id` is the id it carried where one could be read, so that a request
    can still be answered."""

    def __init__(self, text: str, request_id: int | None) -> None:
        super().__init__(text)
        self.request_id = request_id


def tag(message: Request | WorkerMessage) -> str:
    """The message's kind as on the wire ("bind", "reply", ...)."""
    return str(message.__struct_config__.tag)


def encode(message: Request | WorkerMessage) -> bytes:
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


async def read(reader: asyncio.StreamReader, decoder: msgspec.msgpack.Decoder[T]) -> T | None:
    """The next message (`decoder`: `REQUESTS` or `WORKER_MESSAGES`), or None at a clean end
    of stream."""
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
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as err:  # ValidationError included
        raise MessageError(f"not a message: {err}", _request_id(body)) from None


def _request_id(body: bytes) -> int | None:
    """The id of a request that did not decode, if its second element is one."""
    try:
        raw = _untyped.decode(body)
    except msgspec.DecodeError:
        return None
    if isinstance(raw, list) and len(raw) > 1 and type(raw[1]) is int:
        request_id: int = raw[1]
        return request_id
    return None
