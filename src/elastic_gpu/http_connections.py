"""Connection limits for the aiohttp servers (the extender, the webhook): `GatedSite`.

aiohttp closes a kept-alive connection after its keepalive_timeout, but it never closes one
that has not sent a request yet, asyncio gives a TLS handshake 60 s, and nothing bounds how
many connections are open (issue 26, item 9). `GatedSite` is aiohttp's TCPSite with a
`ConnectionGate` between the stream and aiohttp's handler of each connection:

- a connection is counted from accept (the protocol factory), before its TLS handshake, and
  the handshake gets `header_timeout_s` (the loop's `ssl_handshake_timeout`);
- a timer closes a connection that has no request in progress: `header_timeout_s` after
  accept, `idle_timeout_s` after each answer (a request in progress is never timed out here);
- at `max_connections`, `core.connlimits.make_room` decides: the oldest idle connections are
  closed for the new one, or the new one is closed as soon as its stream is up when none can
  be (every connection busy, or still in its handshake, which ends by the header timeout).

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
    """One accepted connection, counted by the gate from accept to close: the protocol the
    stream (TLS or plain) delivers to, forwarding to aiohttp's handler."""

    def __init__(self, gate: ConnectionGate, handler_factory: Callable[[], Any]) -> None:
        self.gate = gate
        self.handler: Any = handler_factory()
        #: the stream's transport once TLS is up (asyncio's or uvloop's: typed loosely)
        self.transport: Any = None
        self.busy = 0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.refused = not gate.admit(self)
        if not self.refused:
            self.arm(gate.limits.header_timeout_s)

    # -- the stream ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.refused or self.closed:
            transport.abort()  # type: ignore[attr-defined]
            return
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
            if not self.refused and getattr(self.handler, "transport", None) is not None:
                self.handler.connection_lost(exc)
        finally:
            self.gone()

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def closable(self) -> bool:
        """Idle, with a transport to close (a TLS handshake in progress has none yet: the
        loop's handshake timeout, the header timeout, ends it)."""
        return not self.busy and self.transport is not None

    def arm(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _expired(self) -> None:
        self.timer = None
        if self.busy:
            return
        self.gate.timeouts += 1
        if self.transport is None:
            # still in its TLS handshake, which the loop aborts at the same timeout (or it
            # failed, unseen): no longer counted; if it completes after all, it is closed
            self.gone()
        else:
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
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
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
        self._by_handler: dict[int, _Connection] = {}
        #: connections closed for being idle too long, for room, and refused at the cap
        self.timeouts = 0
        self.shed = 0
        self.refused = 0

    @property
    def open_count(self) -> int:
        return len(self._open)

    def protocol_factory(self, handler_factory: Callable[[], Any]
                         ) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self, handler_factory)

    def admit(self, connection: _Connection) -> bool:
        """Count a connection just accepted, making room (`make_room`) if the cap is reached;
        False: refused (closed as soon as its stream is up)."""
        idle = [c for c in self._open if c.closable]
        room = make_room(len(self._open), idle, self.cap)
        for old in room.close:
            self.shed += 1
            old.close()
        if room.refuse_new:
            self.refused += 1
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
        for connection in [c for c in self._open if c.closable]:
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
        tls: dict[str, Any] = {} if self._ssl_context is None else {
            "ssl": self._ssl_context,
            "ssl_handshake_timeout": self.gate.limits.header_timeout_s}
        self._server = await asyncio.get_running_loop().create_server(
            self.gate.protocol_factory(server), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address, **tls)

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
