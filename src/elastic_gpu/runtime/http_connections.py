"""Connection limits for the HTTP servers (the extender, the webhook): `GatedSite`.

aiohttp closes a kept-alive connection after its keepalive_timeout, but it never closes one
that has not sent a request yet, asyncio gives a TLS handshake 60 s, and nothing bounds how
many connections are open (issue 26, item 9). `GatedSite` is aiohttp's TCPSite with its own
accept loop and a `ConnectionGate` that holds every connection from accept:

- each accepted socket is counted and timed at once, then handed to the loop
  (`connect_accepted_socket`, TLS included, the handshake bounded by the header timeout) with
  the gate between the stream and the protocol that serves it: the gate's own servers for a
  server with an app (`ConnectionGate.app`: `http1`, or `http2` where TLS negotiates it; the
  extender), else aiohttp's handler (the webhook); the gate keeps the socket, so a
  connection still in its handshake can be closed too (`shutdown`);
- a timer closes a connection that has no request in progress: `header_timeout_s` after
  accept, `idle_timeout_s` after each answer (a request in progress is never timed out here);
- a request's body must arrive within `body_timeout_s` of its headers, else it is answered
  408 and read no further (HTTP/1.1: the connection closes; HTTP/2: the stream is reset): the
  protocol servers time it, and for aiohttp's handler the middleware;
- at `max_connections`, `core.connlimits.make_room` decides: the oldest idle connections are
  closed for the new one, or the new one is closed at once when every connection is busy;
- out of file descriptors (EMFILE), accepting pauses briefly and resumes: the server never
  fails for it.

A request is "in progress" from its complete headers (an aiohttp middleware, or the protocol
server) to the return of its handler; a client that trickles its headers stays idle and meets
the header timeout. On stop (`close_idle`) idle connections close at once and busy ones once
their requests are answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from elastic_gpu.core.connlimits import ConnectionLimits, effective_cap, make_room
from elastic_gpu.runtime.http1 import Http1Server
from elastic_gpu.runtime.http2 import Http2Server, negotiated_h2
from elastic_gpu.runtime.httpapp import BodyBudget, HttpApp, body_late

log = logging.getLogger(__name__)


def fd_limit() -> int | None:
    """The process's soft RLIMIT_NOFILE (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


class _Connection(asyncio.Protocol):
    """One accepted connection, counted by the gate from accept to close: the protocol the
    stream (TLS or plain) delivers to, forwarding to the protocol that serves it."""

    def __init__(self, gate: ConnectionGate, handler_factory: Callable[[], Any],
                 sock: socket.socket) -> None:
        self.gate = gate
        #: what makes aiohttp's handler, for a server without an app of its own (`gate.app`)
        self.handler_factory = handler_factory
        #: the protocol serving the connection, chosen once the stream is up
        self.handler: Any = None
        #: the accepted socket (the transport owns it once made; closed, its fileno is -1)
        self.sock = sock
        #: the stream's transport once up (asyncio's or uvloop's: typed loosely)
        self.transport: Any = None
        self.busy = 0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    # -- the stream ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.closed:
            transport.abort()  # type: ignore[attr-defined]
            return
        gate = self.gate
        if gate.app is None:
            self.handler = self.handler_factory()
            gate.by_handler[id(self.handler)] = self  # the middleware's lookup
        elif negotiated_h2(transport):
            self.handler = Http2Server(gate.app, self, gate.body_budget)
            gate.http2_count += 1
        else:
            self.handler = Http1Server(gate.app, self, gate.body_budget, gate.loop)
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.handler.eof_received()
        return result

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            if self.handler is not None and getattr(self.handler, "transport", None) is not None:
                self.handler.connection_lost(exc)
        finally:
            self.gone()

    # -- lifecycle -------------------------------------------------------------------------
    def arm(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.gate.loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self.timer = None
        if not self.busy:
            self.gate.timeouts += 1
            self.close()

    @property
    def body_timeout_s(self) -> float:
        return self.gate.limits.body_timeout_s

    def body_timed_out(self) -> None:
        self.gate.body_timeouts += 1

    def request_started(self) -> None:
        self.busy += 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def request_finished(self) -> None:
        self.busy -= 1
        if self.busy or self.closed:
            return
        if self.gate.draining:
            self.close_answered()
        else:
            self.arm(self.gate.limits.idle_timeout_s)

    def close_answered(self) -> None:
        """Close once the answers handed to the transport are sent (the server is stopping):
        HTTP/2 says GOAWAY; an HTTP/1.1 transport sends what it holds, then closes; aiohttp's
        connections are closed by its runner's cleanup."""
        if isinstance(self.handler, Http2Server):
            self.handler.goaway()
        elif isinstance(self.handler, Http1Server) and not self.transport.is_closing():
            self.transport.close()

    def close(self) -> None:
        """Close at once (an idle connection: nothing is lost). In its TLS handshake it has no
        transport yet: shutting the socket down fails the handshake, and the loop closes it."""
        if isinstance(self.handler, Http2Server):
            self.handler.goaway()  # HTTP/2 says so first: the client retries elsewhere
        elif self.transport is not None:
            if not self.transport.is_closing():
                self.transport.abort()
        else:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        self.gone()

    def gone(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.gate.forget(self)


class ConnectionGate:
    """The open connections of one server, oldest first, and the limits they live under."""

    def __init__(self, limits: ConnectionLimits, fds: int | None = None) -> None:
        self.limits = limits
        self.cap = effective_cap(limits.max_connections, fds if fds is not None else fd_limit())
        self._open: OrderedDict[_Connection, None] = OrderedDict()
        #: connections served by aiohttp's handler, by the handler (the middleware's lookup)
        self.by_handler: dict[int, _Connection] = {}
        #: the server is stopping: connections close once their requests are answered
        self.draining = False
        #: connections accepted; closed for being idle too long, for room; refused at the cap
        self.accepted_count = 0
        self.timeouts = 0
        #: requests answered 408: their bodies did not arrive within `body_timeout_s`
        self.body_timeouts = 0
        self.shed = 0
        self.refused = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the app the gate's own protocol servers answer with: HTTP/1.1 (`http1`), and HTTP/2
        #: where TLS with ALPN `h2` negotiates it (the server's context must offer it). None:
        #: aiohttp's handler serves every connection, HTTP/1.1 only (the webhook)
        self.app: HttpApp | None = None
        #: connections that negotiated HTTP/2; the request bodies every connection may hold
        self.http2_count = 0
        self.body_budget = BodyBudget()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop serving the connections, asked once: in Python 3.11
        `asyncio.get_running_loop` makes a getpid system call, and a timer is armed per
        request."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def open_count(self) -> int:
        return len(self._open)

    def accepted(self, sock: socket.socket, handler_factory: Callable[[], Any],
                 context: ssl.SSLContext | None) -> None:
        """Take a socket just accepted: make room for it (`make_room`) or close it, then
        time it and hand it to the loop (TLS, then aiohttp's handler)."""
        self.accepted_count += 1
        idle = [c for c in self._open if not c.busy]
        room = make_room(len(self._open), idle, self.cap)
        for old in room.close:
            self.shed += 1
            old.close()
        if room.refuse_new:
            self.refused += 1
            sock.close()
            return
        connection = _Connection(self, handler_factory, sock)
        self._open[connection] = None
        connection.arm(self.limits.header_timeout_s)
        self.loop.create_task(self._stream(connection, context))

    async def _stream(self, connection: _Connection, context: ssl.SSLContext | None) -> None:
        tls: dict[str, Any] = {} if context is None else {
            "ssl": context, "ssl_handshake_timeout": self.limits.header_timeout_s}
        try:
            await self.loop.connect_accepted_socket(
                lambda: connection, connection.sock, **tls)
        except (OSError, ssl.SSLError, ValueError, RuntimeError) as err:
            log.debug("connection not established: %s", err)  # the loop closed the socket
            connection.gone()

    def forget(self, connection: _Connection) -> None:
        self._open.pop(connection, None)
        if connection.handler is not None:
            self.by_handler.pop(id(connection.handler), None)

    def close_idle(self) -> None:
        """The server stops: close every connection with no request in progress, and each
        of the others once its requests are answered (the extender drains its binds;
        aiohttp's cleanup closes its own)."""
        self.draining = True
        for connection in [c for c in self._open if not c.busy]:
            connection.close()

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        connection = self.by_handler.get(id(request.protocol))
        if connection is None:  # served without the gate (a test's own runner)
            return await handler(request)
        connection.request_started()
        # the body must arrive within the limit: past it, a handler still waiting for it is
        # cancelled and the client answered 408 (the handler's own read is left as it is, so
        # its answers, 413 included, stay its own)
        task = asyncio.current_task()
        late = False

        def expire() -> None:
            nonlocal late
            if not request.content.is_eof() and task is not None:
                late = True
                task.cancel()

        timer = (None if request.content.is_eof() else
                 self.loop.call_later(connection.body_timeout_s, expire))
        try:
            return await handler(request)
        except asyncio.CancelledError:
            if not late or task is None:
                raise
            task.uncancel()
            connection.body_timed_out()
            response = web.Response(status=408, text=body_late(connection.body_timeout_s) + "\n")
            response.force_close()
            return response
        finally:
            if timer is not None:
                timer.cancel()
            connection.request_finished()


class _Listener:
    """The listening socket and its accept loop (what aiohttp's site keeps as `_server`): a
    reader on the socket that accepts until none is waiting, not a `sock_accept` per
    connection (which adds and removes the socket's reader each time: kube-scheduler's
    extender client opens about one connection a pod)."""

    def __init__(self, sock: socket.socket, gate: ConnectionGate,
                 handler_factory: Callable[[], Any], context: ssl.SSLContext | None) -> None:
        self.sockets = [sock]
        self._sock = sock
        self._gate = gate
        self._handler_factory = handler_factory
        self._context = context
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        self._loop.add_reader(sock.fileno(), self._accept_waiting)

    def _accept_waiting(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as err:  # out of descriptors (EMFILE, ENFILE), mostly: wait
                log.warning("accepting a connection failed (%s); %d open, retrying in 0.1 s",
                            err, self._gate.open_count)
                self._loop.remove_reader(self._sock.fileno())
                self._retry = self._loop.call_later(0.1, self._resume)
                return
            sock.setblocking(False)
            self._gate.accepted(sock, self._handler_factory, self._context)

    def _resume(self) -> None:
        self._retry = None
        self._loop.add_reader(self._sock.fileno(), self._accept_waiting)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        elif self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


class GateCollector(Collector):
    """A gate's connections on its component's `/metrics` page (`prefix`: the component's,
    e.g. `elasticgpu_scheduler_`): open now, and how many were accepted, closed idle, closed
    for room and refused at the cap. A client that opens a connection per request shows as
    accepted connections growing as fast as requests (kube-scheduler's extender client keeps
    two idle connections, so with binds in flight it opens about one a pod)."""

    def __init__(self, gate: ConnectionGate, prefix: str) -> None:
        self._gate = gate
        self._prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gate = self._gate
        yield GaugeMetricFamily(self._prefix + "connections_open",
                                "HTTP connections open now", value=gate.open_count)
        outcomes = CounterMetricFamily(
            self._prefix + "connections",
            "HTTP connections by what became of them: accepted (every one), idle_timeout "
            "(closed with no request in progress past the idle or header timeout), shed "
            "(closed idle to make room at the cap), refused (closed at once: every open one "
            "was busy at the cap)", labels=["outcome"])
        for outcome, value in (("accepted", gate.accepted_count), ("idle_timeout", gate.timeouts),
                               ("shed", gate.shed), ("refused", gate.refused)):
            outcomes.add_metric([outcome], value)
        yield outcomes
        yield CounterMetricFamily(
            self._prefix + "request_body_timeouts",
            "Requests answered 408 because their body did not arrive within bodyTimeoutSeconds "
            "of their headers (over HTTP/1.1 the connection is closed after)",
            value=gate.body_timeouts)
        if gate.app is not None:  # a server with its own protocols (the extender)
            yield CounterMetricFamily(
                self._prefix + "connections_http2",
                "HTTP connections that negotiated HTTP/2 (TLS with ALPN h2): each carries "
                "every request of its client, one stream each", value=gate.http2_count)


class GatedSite(web.TCPSite):
    """aiohttp's TCPSite, every connection accepted and held by `gate`."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *,
                 gate: ConnectionGate, ssl_context: ssl.SSLContext | None = None,
                 reuse_address: bool | None = None, backlog: int = 128) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context,
                         reuse_address=reuse_address, backlog=backlog)
        self.gate = gate

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        host = self._host or ""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, self._port), family=family,
                                        backlog=self._backlog)
        listener.setblocking(False)
        self._server = _Listener(listener, self.gate, server,  # type: ignore[assignment]
                                 self._ssl_context)
        self._bound_port = listener.getsockname()[1]

    async def stop(self) -> None:
        await super().stop()  # the listener closes: no new connections
        self.gate.close_idle()


def gated_app(app: web.Application, gate: ConnectionGate) -> web.Application:
    """`app` with the gate's middleware (marks requests in progress); before the runner."""
    app.middlewares.append(gate.middleware)
    return app


def runner_options(limits: ConnectionLimits) -> dict[str, Any]:
    """aiohttp's own idle close, the same as the gate's (belt and braces)."""
    return {"keepalive_timeout": limits.idle_timeout_s}
