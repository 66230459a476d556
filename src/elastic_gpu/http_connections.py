"""Connection limits for the aiohttp servers (the extender, the webhook): `GatedSite`.

aiohttp closes a kept-alive connection after its keepalive_timeout, but it never closes one
that has not sent a request yet, asyncio gives a TLS handshake 60 s, and nothing bounds how
many connections are open (issue 26, item 9). `GatedSite` is aiohttp's TCPSite with a
`ConnectionGate` in front of each connection, at the TCP level, from accept:

- TLS is started by the gate (`loop.start_tls`, the handshake bounded by the header
  timeout), so a connection is counted, timed and closable before and during its handshake,
  not only once aiohttp sees it;
- a timer closes a connection that has no request in progress: `header_timeout_s` after
  accept, `idle_timeout_s` after each answer (a request in progress is never timed out here);
- at `max_connections`, `core.connlimits.make_room` decides: the oldest idle connections are
  closed for the new one, or the new one is closed at once when every connection is busy.

A request is "in progress" from its complete headers (an aiohttp middleware) to the return of
its handler; a client that trickles its headers stays idle and meets the header timeout.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from elastic_gpu.core.connlimits import ConnectionLimits, effective_cap, make_room

log = logging.getLogger(__name__)


def fd_limit() -> int | None:
    """The process's soft RLIMIT_NOFILE (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


class _Connection(asyncio.Protocol):
    """One accepted TCP connection: counted by the gate from accept to close. It starts TLS
    itself (when the site serves HTTPS) and then hands the stream to aiohttp's handler
    through `_App`."""

    def __init__(self, gate: ConnectionGate, handler_factory: Callable[[], Any],
                 context: ssl.SSLContext | None) -> None:
        self.gate = gate
        self.handler: Any = handler_factory()
        self.context = context
        self.tcp: asyncio.Transport | None = None
        self.busy = 0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self._starting: asyncio.Task[None] | None = None

    # -- the TCP transport's protocol until TLS or aiohttp takes over ---------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.tcp = transport
        if not self.gate.admit(self):
            return
        self.arm(self.gate.limits.header_timeout_s)
        app = _App(self)
        if self.context is None:
            transport.set_protocol(app)
            app.connection_made(transport)
            return
        transport.pause_reading()  # nothing is read before the TLS layer is in place
        self._starting = asyncio.get_running_loop().create_task(self._start_tls(app))

    async def _start_tls(self, app: _App) -> None:
        assert self.tcp is not None and self.context is not None
        try:
            tls = await asyncio.get_running_loop().start_tls(
                self.tcp, app, self.context, server_side=True,
                ssl_handshake_timeout=self.gate.limits.header_timeout_s)
        except (OSError, ssl.SSLError, ConnectionError, TimeoutError, RuntimeError) as err:
            log.debug("TLS handshake failed: %s", err)
            self.close()
            return
        if tls is None or self.closed:
            self.close()
            return
        app.connection_made(tls)

    def connection_lost(self, exc: Exception | None) -> None:
        # only before TLS or aiohttp took the transport over
        self.gone()

    # -- lifecycle -------------------------------------------------------------------------
    def arm(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _expired(self) -> None:
        self.timer = None
        if not self.busy:
            self.gate.timeouts += 1
            self.close()

    def request_started(self) -> None:
        self.busy += 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def request_finished(self) -> None:
        self.busy -= 1
        if not self.busy and not self.closed:
            self.arm(self.gate.limits.idle_timeout_s)

    def close(self) -> None:
        """Close at once (an idle connection: nothing is lost)."""
        if self.tcp is not None and not self.tcp.is_closing():
            self.tcp.abort()
        self.gone()

    def gone(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        self.gate.forget(self)


class _App(asyncio.Protocol):
    """The stream's protocol (TLS or plain): aiohttp's handler, and the gate told when the
    connection is gone."""

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.handler = connection.handler

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
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
            if getattr(self.handler, "transport", None) is not None:
                self.handler.connection_lost(exc)
        finally:
            self.connection.gone()


class ConnectionGate:
    """The open connections of one server, oldest first, and the limits they live under."""

    def __init__(self, limits: ConnectionLimits, fds: int | None = None) -> None:
        self.limits = limits
        self.cap = effective_cap(limits.max_connections, fds if fds is not None else fd_limit())
        self._open: OrderedDict[_Connection, None] = OrderedDict()
        self._by_handler: dict[int, _Connection] = {}
        #: connections closed for being idle too long, for room, and refused at the cap
        self.timeouts = 0
        self.shed = 0
        self.refused = 0

    @property
    def open_count(self) -> int:
        return len(self._open)

    def protocol_factory(self, handler_factory: Callable[[], Any],
                         context: ssl.SSLContext | None) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self, handler_factory, context)

    def admit(self, connection: _Connection) -> bool:
        idle = [c for c in self._open if not c.busy]
        room = make_room(len(self._open), idle, self.cap)
        for old in room.close:
            self.shed += 1
            old.close()
        if room.refuse_new:
            self.refused += 1
            connection.closed = True
            if connection.tcp is not None:
                connection.tcp.abort()
            return False
        self._open[connection] = None
        self._by_handler[id(connection.handler)] = connection
        return True

    def forget(self, connection: _Connection) -> None:
        self._open.pop(connection, None)
        self._by_handler.pop(id(connection.handler), None)

    def close_idle(self) -> None:
        """Close every connection with no request in progress (requests in progress finish:
        the extender drains its binds; aiohttp's cleanup closes the rest)."""
        for connection in [c for c in self._open if not c.busy]:
            connection.close()

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        connection = self._by_handler.get(id(request.protocol))
        if connection is None:  # served without the gate (a test's own runner)
            return await handler(request)
        connection.request_started()
        try:
            return await handler(request)
        finally:
            connection.request_finished()


class GatedSite(web.TCPSite):
    """aiohttp's TCPSite, every connection through `gate` (TLS started by the gate)."""

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
        self._server = await asyncio.get_running_loop().create_server(
            self.gate.protocol_factory(server, self._ssl_context), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address)

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
