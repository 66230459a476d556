"""HTTP/2 on a gated TLS connection (`http_connections`), for clients that negotiate it.

kube-scheduler's extender client is Go's `http.Transport` with HTTP/2 enabled
(`utilnet.SetTransportDefaults`): over TLS it offers `h2` by ALPN. Speaking HTTP/1.1 only,
the extender saw about one new connection a pod (Go keeps two idle HTTP/1.1 connections a host
and binds run concurrently), each a TLS handshake of ~2 ms of the extender's CPU and more of
kube-scheduler's (docs/benchmarks.md, "HTTPS"). Over HTTP/2 every request is a stream of one
long-lived connection.

`Http2Server` is the protocol object of one such connection: frames in and out through the
`h2` state machine (sans-IO), each request's body collected within the app's limit, answered
by the app (`httpapp.HttpApp`) in a task of its own, the answer sent within the peer's
flow-control windows. A body must arrive within `Busy.body_timeout_s` of its headers, else the
stream is answered 408 and reset. A request in progress marks the connection busy (the gate's
timers leave it alone); a protocol error closes the connection (h2 sends GOAWAY first), never
the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from elastic_gpu.runtime.httpapp import Answer, BodyBudget, Busy, HttpApp, body_late

log = logging.getLogger(__name__)

#: Streams a client may have open at once. Go opens another connection past it (its
#: transport does not wait for a stream by default); kube-scheduler's extender client has one
#: scheduling cycle and its binds in flight.
MAX_STREAMS = 128
#: Header block (decoded) a request may send: kube-scheduler sends a handful of headers.
MAX_HEADER_LIST = 16 * 1024
#: How long a closing connection may take to send its GOAWAY before it is aborted.
GOAWAY_GRACE_S = 1.0


@dataclass
class _Stream:
    method: str
    path: str
    headers: dict[str, str]
    limit: int
    body: list[bytes] = field(default_factory=list)
    #: bytes of body received (held in the `BodyBudget` until the stream is finished)
    size: int = 0
    task: asyncio.Task[None] | None = None
    finished: bool = False
    #: armed while the body is still arriving: past `Busy.body_timeout_s` it is answered 408
    deadline: asyncio.TimerHandle | None = None


class Http2Server:
    """One HTTP/2 connection (after TLS with ALPN `h2`): `asyncio.Protocol`'s methods, called
    by the gate's connection object."""

    def __init__(self, app: HttpApp, busy: Busy, budget: BodyBudget) -> None:
        self._app = app
        self._busy = busy
        self._budget = budget
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8", validate_inbound_headers=True))
        self.transport: Any = None
        self._streams: dict[int, _Stream] = {}
        self._loop = asyncio.get_running_loop()
        #: set when the peer opens a flow-control window or the transport drains
        self._can_send = asyncio.Event()
        self._paused = False
        self._closed = False

    # -- the stream ------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            h2.settings.SettingCodes.ENABLE_PUSH: 0})
        # settings given before the preface are current at once, but h2 sized its header
        # decoder from its defaults (64 KiB) when it was made
        self._conn.decoder.max_header_list_size = MAX_HEADER_LIST
        self._conn.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except (h2.exceptions.ProtocolError, ValueError) as err:
            # h2 has queued a GOAWAY naming the error where it can; then the connection ends
            log.debug("HTTP/2 protocol error: %s; closing the connection", err)
            self._flush()
            self._close()
            return
        for event in events:
            self._on_event(event)
        self._flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        self._paused = True
        self._can_send.clear()

    def resume_writing(self) -> None:
        self._paused = False
        self._can_send.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        for stream_id in list(self._streams):
            self._drop(stream_id)
        self._can_send.set()  # senders wake, see the connection closed, and stop

    # -- frames ----------------------------------------------------------------------------
    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id)
            if stream is not None and stream.task is None:
                self._disarm(stream)
                stream.task = self._loop.create_task(self._answer(event.stream_id, stream))
        elif isinstance(event, h2.events.StreamReset):
            self._drop(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._can_send.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._close()

    def _request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        assert stream_id is not None and event.headers is not None
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name if isinstance(name, str) else name.decode()
            headers[key] = value if isinstance(value, str) else value.decode()
        method, path = headers.get(":method", ""), headers.get(":path", "").split("?", 1)[0]
        limit = self._app.body_limit(method, path)
        stream = _Stream(method, path, headers, limit)
        self._streams[stream_id] = stream
        self._busy.request_started()
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            self._refuse_large(stream_id, stream, int(length))
        elif not event.stream_ended:  # a body follows: it has `body_timeout_s` to arrive
            stream.deadline = self._loop.call_later(self._busy.body_timeout_s,
                                                    self._body_late, stream_id, stream)

    def _body_late(self, stream_id: int, stream: _Stream) -> None:
        """The body did not arrive in time: 408, and the stream is reset after it."""
        stream.deadline = None
        if self._streams.get(stream_id) is stream and stream.task is None and not self._closed:
            self._busy.body_timed_out()
            answer: Answer = (408, [("content-type", "text/plain; charset=utf-8")],
                              f"{body_late(self._busy.body_timeout_s)}\n".encode())
            stream.body.clear()
            stream.task = self._loop.create_task(
                self._send_answer(stream_id, stream, answer, reset_after=True))

    @staticmethod
    def _disarm(stream: _Stream) -> None:
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None

    def _data(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id
        assert stream_id is not None and event.data is not None
        stream = self._streams.get(stream_id)
        # the window is the connection's as well: give the bytes back even of a dropped stream
        self._conn.acknowledge_received_data(event.flow_controlled_length or 0, stream_id)
        if stream is None or stream.task is not None:
            return
        size = len(event.data)
        if stream.size + size > stream.limit:
            self._refuse_large(stream_id, stream, stream.size + size)
            return
        if not self._budget.take(size):
            self._reset(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        stream.body.append(event.data)
        stream.size += size

    def _refuse_large(self, stream_id: int, stream: _Stream, size: int) -> None:
        """Answer 413 at once and read no more of the body (the stream is reset after it)."""
        answer = self._app.too_large(stream.method, stream.path, size)
        self._disarm(stream)
        stream.body.clear()
        stream.task = self._loop.create_task(
            self._send_answer(stream_id, stream, answer, reset_after=True))

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._conn.reset_stream(stream_id, code)
        self._drop(stream_id)

    def _drop(self, stream_id: int) -> None:
        """The stream is gone (reset by either side, or the connection): its task with it."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        self._finish(stream_id, stream)
        if stream.task is not None:
            stream.task.cancel()

    # -- answers ---------------------------------------------------------------------------
    async def _answer(self, stream_id: int, stream: _Stream) -> None:
        body = b"".join(stream.body)
        stream.body.clear()
        try:
            answer = await self._app.respond(stream.method, stream.path, stream.headers, body)
        except asyncio.CancelledError:
            self._finish(stream_id, stream)
            raise
        except Exception:  # last resort, as the HTTP/1.1 path: a bug must not end the server
            log.exception("HTTP/2 %s %s: unexpected error", stream.method, stream.path)
            answer = (500, [("content-type", "text/plain")], b"internal error; see the log")
        await self._send_answer(stream_id, stream, answer)

    async def _send_answer(self, stream_id: int, stream: _Stream, answer: Answer,
                           reset_after: bool = False) -> None:
        status, headers, body = answer
        pieces = [body] if isinstance(body, bytes) else [piece for piece in body if piece]
        size = sum(len(piece) for piece in pieces)
        try:
            self._conn.send_headers(stream_id, [(":status", str(status)), *headers,
                                                ("content-length", str(size))],
                                    end_stream=not size)
            self._flush()
            for number, piece in enumerate(pieces, 1):
                await self._send_body(stream_id, piece, last=number == len(pieces))
            if reset_after and stream_id in self._streams:
                self._conn.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
                self._flush()
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # the client reset the stream or the connection is ending: nothing to send
        finally:
            self._finish(stream_id, stream)

    async def _send_body(self, stream_id: int, body: bytes, last: bool = True) -> None:
        """`body` in DATA frames as the flow-control windows allow; `last`: the stream ends
        with it."""
        view = memoryview(body)
        while view and not self._closed:
            window = min(self._conn.local_flow_control_window(stream_id),
                         self._conn.max_outbound_frame_size)
            if window <= 0 or self._paused:
                self._can_send.clear()
                await self._can_send.wait()
                continue
            chunk, view = view[:window], view[window:]
            self._conn.send_data(stream_id, chunk.tobytes(), end_stream=last and not view)
            self._flush()
        if not last:
            await asyncio.sleep(0)  # a large answer's pieces: other work between them

    def _finish(self, stream_id: int, stream: _Stream) -> None:
        """The request is over (answered, reset, or its connection gone): once per stream."""
        if stream.finished:
            return
        stream.finished = True
        self._disarm(stream)
        self._budget.give(stream.size)
        if self._streams.get(stream_id) is stream:
            del self._streams[stream_id]
        self._busy.request_finished()

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def goaway(self) -> None:
        """Close the connection with GOAWAY (the gate's idle close, the server's stop): the
        client then knows no stream of it was taken and opens another connection for its next
        request, where an abrupt close fails a request that raced it. Aborted after
        `GOAWAY_GRACE_S` if the client does not take the frame."""
        if self.transport is None or self.transport.is_closing():
            return
        self._conn.close_connection()
        self._flush()
        transport = self.transport
        transport.close()
        self._loop.call_later(GOAWAY_GRACE_S, transport.abort)


def negotiated_h2(transport: Any) -> bool:
    """Whether the client chose HTTP/2 by ALPN on this (TLS) transport."""
    ssl_object = transport.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"

