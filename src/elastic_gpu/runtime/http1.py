"""HTTP/1.1 on a gated connection (`http_connections`): the extender's own server for the
clients that do not negotiate HTTP/2 (kube-scheduler over plain HTTP, probes, scrapers).

Why not aiohttp's handler: kube-scheduler sends two requests a pod (filter, bind) and, with
binds in flight, opens a connection for most binds (Go keeps two idle HTTP/1.1 connections a
host). aiohttp's handler cost the extender's process ~100 us of CPU a kept-alive request and
~350 us a new connection (`bench/sched_http_cpu.py`); this server ~70 and ~210 us, side by side
(docs/benchmarks.md, "The extender's own HTTP/1.1 server"). The app (`httpapp.HttpApp`) is the
one HTTP/2 streams are answered by, so the routes, limits and outcomes are one code.

What it speaks (RFC 9112), and what it refuses:

- one request at a time per connection; requests sent ahead (pipelined) wait in the buffer,
  reading pauses past `PIPELINE_BYTES`, and they are answered in order, each once the
  transport has taken the answers before it (a client that does not read its answers stops
  getting them, and its connection is idle for the gate's timer);
- a head (request line and header fields) of at most `MAX_HEAD` bytes, else 431; a request
  line other than `METHOD /target HTTP/1.x`, a header line without a name and colon, a folded
  line, or a NUL is 400; another HTTP version is 505;
- a body framed by Content-Length or `Transfer-Encoding: chunked`; both at once, another
  coding (501), or a malformed length or chunk is refused and the connection closed: past a
  framing error the next request's start cannot be trusted (request smuggling);
- a body past the app's `body_limit` is answered by the app's `too_large` as soon as that is
  known (from Content-Length, before a byte of it, or as the chunks arrive), and the rest is
  not read; the bodies every connection holds at once are bounded (`httpapp.BodyBudget`):
  past it 429 with Retry-After;
- a body must arrive whole within `Busy.body_timeout_s` of its head, else 408 and the
  connection closes: a request being read is in progress, so the gate's idle timer would never
  end a client that trickles one;
- `Expect: 100-continue` is answered 100 once the body is known to be within its limit;
- kept alive unless the client sends `Connection: close` or speaks HTTP/1.0 without
  `keep-alive`; HEAD is answered as GET without the body;
- a connection refused mid-request closes after its answer with a lingering close (the
  write side first, then the rest of what the client sends is read and dropped for
  `LINGER_S`): closing with unread bytes would reset the connection, and the client could
  lose the answer.

A request is in progress (the gate's timers leave the connection alone) from its complete head
to its answer's last byte handed to the transport.
"""

from __future__ import annotations

import asyncio
import http
import logging
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.runtime.httpapp import Answer, BodyBudget, Busy, HttpApp, body_late

log = logging.getLogger(__name__)

#: Bytes a request's head may take (request line and header fields).
MAX_HEAD = 16 * 1024
#: Bytes of requests sent ahead of the one being answered, before reading pauses.
PIPELINE_BYTES = 64 * 1024
#: Bytes a chunk-size line may take (size and extensions).
MAX_CHUNK_LINE = 1024
#: How long a connection refused mid-request drops what the client still sends before closing.
LINGER_S = 1.0

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEX = frozenset("0123456789abcdefABCDEF")


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _Refused(Exception):
    """A request that cannot be read; answered with `status` and the connection closed."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    keep_alive: bool
    #: Content-Length; None: chunked
    length: int | None
    limit: int
    body: list[bytes] = field(default_factory=list)
    #: bytes of body received (held in the `BodyBudget` until the answer is sent)
    size: int = 0
    #: chunked: bytes left of the current chunk's data; then its CRLF; then the trailer
    chunk_left: int = 0
    chunk_crlf: bool = False
    last_chunk: bool = False
    #: the gate was told it started (`Busy.request_started`), and not yet that it finished
    started: bool = False
    #: armed while the body is still arriving: past `Busy.body_timeout_s` it is answered 408
    deadline: asyncio.TimerHandle | None = None


def parse_head(head: bytes) -> _Request:
    """A request's head (without its blank line) as a request with no body read yet; raises
    `_Refused` for what is not HTTP/1.x as RFC 9112 frames it."""
    if b"\x00" in head:
        raise _Refused(400, "a NUL in the request head")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise _Refused(400, f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if not version.startswith("HTTP/"):
            raise _Refused(400, f"malformed request line {lines[0][:100]!r}")
        raise _Refused(505, f"{version[:20]} is not served; HTTP/1.1 and HTTP/2 are")
    if not target.startswith("/"):
        raise _Refused(400, f"request target {target[:100]!r} is not a path")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name[0] in " \t" or name[-1] in " \t" or " " in name:
            raise _Refused(400, f"malformed header line {line[:100]!r}")
        key = name.lower()
        value = value.strip(" \t")
        if key in headers:
            if key == "content-length" and headers[key] != value:
                raise _Refused(400, "two different Content-Length headers")
            if key != "content-length":
                value = f"{headers[key]}, {value}"
        headers[key] = value
    connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
    keep_alive = ("close" not in connection if version == "HTTP/1.1"
                  else "keep-alive" in connection)
    coding = headers.get("transfer-encoding")
    length: int | None = 0
    if coding is not None:
        if "content-length" in headers:
            raise _Refused(400, "both Content-Length and Transfer-Encoding")
        if coding.lower() != "chunked" or version != "HTTP/1.1":
            raise _Refused(501, f"Transfer-Encoding {coding[:50]!r} is not served; "
                                "chunked is")
        length = None
    elif "content-length" in headers:
        text = headers["content-length"]
        if not text.isascii() or not text.isdigit() or len(text) > 18:
            raise _Refused(400, f"malformed Content-Length {text[:30]!r}")
        length = int(text)
    return _Request(method, target.split("?", 1)[0], headers, keep_alive, length, 0)


class Http1Server:
    """One HTTP/1.1 connection: `asyncio.Protocol`'s methods, called by the gate's connection
    object."""

    def __init__(self, app: HttpApp, busy: Busy, budget: BodyBudget,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._app = app
        self._busy = busy
        self._budget = budget
        self._loop = loop
        self.transport: Any = None
        self._buf = bytearray()
        #: the request being read, then answered
        self._request: _Request | None = None
        #: the task answering the request (held: the loop keeps only a weak reference); while
        #: it runs, nothing more is read of the buffer
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        #: set while the transport takes more (cleared by `pause_writing`)
        self._can_send: asyncio.Event | None = None
        #: refused: what the client still sends is dropped until the connection closes
        self._discard = False
        self._linger: asyncio.TimerHandle | None = None
        self._eof = False
        self._closed = False

    # -- the stream ------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        self._buf += data
        if self._task is None:
            self._advance()
        elif len(self._buf) > PIPELINE_BYTES and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self._eof = True
        # a request being answered keeps the connection open for its answer; then it closes
        return True if self._task is not None else None

    def pause_writing(self) -> None:
        if self._can_send is None:
            self._can_send = asyncio.Event()
        self._can_send.clear()

    def resume_writing(self) -> None:
        if self._can_send is not None:
            self._can_send.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._linger is not None:
            self._linger.cancel()
        if self._can_send is not None:
            self._can_send.set()  # a sender wakes, sees the connection closed, and stops
        request = self._request
        if request is not None and self._task is None:
            self._finish(request)  # read in part: an answering task finishes its own

    # -- reading ---------------------------------------------------------------------------
    def _advance(self) -> None:
        """Read requests from the buffer until one is complete (then answer it) or more bytes
        are needed."""
        while self._task is None and not self._closed:
            request = self._request
            if request is None:
                request = self._next_head()
                if request is None:
                    return
            try:
                complete = self._read_body(request)
            except _Refused as refused:
                self._refuse(refused)
                return
            if not complete:
                if request.deadline is None and self._task is None:  # (else: refused)
                    request.deadline = self._loop.call_later(
                        self._busy.body_timeout_s, self._body_late, request)
                return
            if request.deadline is not None:
                request.deadline.cancel()
                request.deadline = None
            self._task = self._loop.create_task(self._answer(request))

    def _body_late(self, request: _Request) -> None:
        """The body did not arrive in time: 408, and the connection closes (what is left of
        the body cannot be told from a next request)."""
        request.deadline = None
        if self._request is request and self._task is None and not self._closed:
            self._busy.body_timed_out()
            self._refuse(_Refused(408, body_late(self._busy.body_timeout_s)))

    def _next_head(self) -> _Request | None:
        buf = self._buf
        while buf[:2] == b"\r\n":  # blank lines before a request line are ignored
            del buf[:2]
        end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._refuse(_Refused(431, f"request head over {MAX_HEAD} bytes"))
            return None
        head = bytes(buf[:end])
        del buf[:end + 4]
        try:
            request = parse_head(head)
        except _Refused as refused:
            self._refuse(refused)
            return None
        request.limit = self._app.body_limit(request.method, request.path)
        self._request = request
        request.started = True
        self._busy.request_started()
        if request.length is not None and request.length > request.limit:
            self._refuse_large(request, request.length)  # before a byte of it is read
            return None
        if (request.length != 0 and request.headers.get("expect", "").lower() == "100-continue"
                and self.transport is not None):
            self.transport.write(_CONTINUE)
        return request

    def _read_body(self, request: _Request) -> bool:
        """Take what the buffer holds of the body; True once it is whole."""
        buf = self._buf
        if request.length is not None:
            take = min(request.length - request.size, len(buf))
            if take:
                self._keep(request, bytes(buf[:take]))
                del buf[:take]
            return request.size == request.length
        while True:  # chunked
            if request.chunk_left:
                take = min(request.chunk_left, len(buf))
                if not take:
                    return False
                self._keep(request, bytes(buf[:take]))
                del buf[:take]
                request.chunk_left -= take
                if request.chunk_left:
                    return False
                request.chunk_crlf = True
            if request.chunk_crlf:
                if len(buf) < 2:
                    return False
                if buf[:2] != b"\r\n":
                    raise _Refused(400, "a chunk's data is not followed by CRLF")
                del buf[:2]
                request.chunk_crlf = False
            if request.last_chunk:  # the trailer section: fields, then a blank line; dropped
                if buf[:2] == b"\r\n":
                    del buf[:2]
                    return True
                end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise _Refused(431, f"chunked trailer over {MAX_HEAD} bytes")
                    return False
                del buf[:end + 4]
                return True
            end = buf.find(b"\r\n", 0, MAX_CHUNK_LINE + 2)
            if end < 0:
                if len(buf) > MAX_CHUNK_LINE:
                    raise _Refused(400, "a chunk-size line over 1024 bytes")
                return False
            digits = bytes(buf[:end]).split(b";", 1)[0].strip(b" \t").decode("latin-1")
            if not digits or len(digits) > 15 or not set(digits) <= _HEX:
                raise _Refused(400, f"malformed chunk size {digits[:20]!r}")
            del buf[:end + 2]
            size = int(digits, 16)
            if size == 0:
                request.last_chunk = True
                continue
            if request.size + size > request.limit:
                self._refuse_large(request, request.size + size)
                return False
            request.chunk_left = size

    def _keep(self, request: _Request, data: bytes) -> None:
        if not self._budget.take(len(data)):
            raise _Refused(429, "the server holds as many request bodies as it may; retry "
                                "shortly")
        request.body.append(data)
        request.size += len(data)

    # -- refusals --------------------------------------------------------------------------
    def _refuse(self, refused: _Refused) -> None:
        """A request that cannot be read: its answer, then the connection closes."""
        headers: list[tuple[str, str]] = [("content-type", "text/plain; charset=utf-8")]
        if refused.status == 429:
            headers.append(("retry-after", "1"))
        self._start_closing_answer((refused.status, headers, f"{refused}\n".encode()))

    def _refuse_large(self, request: _Request, size: int) -> None:
        self._start_closing_answer(self._app.too_large(request.method, request.path, size))

    def _start_closing_answer(self, answer: Answer) -> None:
        request = self._request
        if request is None:  # refused before its head was whole: no request to finish
            request = _Request("", "", {}, False, 0, 0)
        request.keep_alive = False
        self._discard = True
        self._buf.clear()
        self._task = self._loop.create_task(self._send_then_finish(request, answer, linger=True))

    # -- answers ---------------------------------------------------------------------------
    async def _answer(self, request: _Request) -> None:
        body = b"".join(request.body)
        request.body.clear()
        method = "GET" if request.method == "HEAD" else request.method
        try:
            answer = await self._app.respond(method, request.path, request.headers, body)
        except asyncio.CancelledError:
            self._finish(request)
            raise
        except Exception:  # last resort, as the HTTP/2 path: a bug must not end the server
            log.exception("HTTP/1.1 %s %s: unexpected error", request.method, request.path)
            answer = (500, [("content-type", "text/plain")], b"internal error; see the log")
        await self._send_then_finish(request, answer, linger=False)

    async def _send_then_finish(self, request: _Request, answer: Answer, linger: bool) -> None:
        keep = request.keep_alive and not self._eof
        try:
            await self._send(request, answer, keep)
        finally:
            self._finish(request)  # the gate may close the connection here (a stopping server)
        if self._closed or self.transport.is_closing():
            return
        if not keep:
            self._close(linger)
            return
        # a client that does not read its answers gets no more of them: the next request
        # waits until the transport takes more, the connection idle meanwhile
        await self._reader_caught_up(None)
        if self._closed or self.transport.is_closing():
            return
        self._task = None
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._buf:
            self._advance()  # requests the client sent ahead

    async def _send(self, request: _Request, answer: Answer, keep: bool) -> None:
        status, headers, body = answer
        pieces = [body] if isinstance(body, bytes) else [piece for piece in body if piece]
        size = sum(len(piece) for piece in pieces)
        # the names as HTTP/1.1 clients are used to seeing them (they compare them caseless)
        lines = [f"HTTP/1.1 {status} {_reason(status)}\r\n"]
        lines.extend(f"{name.title()}: {value}\r\n" for name, value in headers)
        lines.append(f"Content-Length: {size}\r\n")
        if not keep:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        if self._closed or self.transport is None:
            return
        if request.method == "HEAD" or not pieces:
            self.transport.write(head)
        elif len(pieces) == 1:
            self.transport.write(head + pieces[0])
        else:  # a large answer's pieces (`/metrics`): as the transport takes them
            self.transport.write(head)
            for piece in pieces:
                if self._closed:
                    return
                self.transport.write(piece)
                await self._reader_caught_up(request)
                await asyncio.sleep(0)  # other work between the pieces

    async def _reader_caught_up(self, request: _Request | None) -> None:
        """Wait while the transport holds as much as it may, the connection idle meanwhile
        (`request`, in the middle of its answer, is in progress again after): a client that
        stops reading meets the gate's idle timer, not a request that never ends."""
        if self._can_send is None or self._can_send.is_set() or self._closed:
            return
        paused = request is not None and request.started
        if paused:
            assert request is not None
            request.started = False
            self._busy.request_finished()
        while not self._can_send.is_set() and not self._closed:
            await self._can_send.wait()
        if paused and not self._closed and not self.transport.is_closing():
            assert request is not None
            request.started = True
            self._busy.request_started()

    def _finish(self, request: _Request) -> None:
        """The request is over (answered, or its connection gone): once per request."""
        if self._request is request:
            self._request = None
        if request.deadline is not None:
            request.deadline.cancel()
            request.deadline = None
        self._budget.give(request.size)
        request.size = 0
        if request.started:
            request.started = False
            self._busy.request_finished()

    def _close(self, linger: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not linger:
            transport.close()
            return
        # the write side first (the answer, then FIN), the rest the client sends is dropped
        if transport.can_write_eof():
            transport.write_eof()
        self._linger = self._loop.call_later(LINGER_S, transport.close)
