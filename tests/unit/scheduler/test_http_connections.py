"""`http_connections.GatedSite`: idle connections are closed, the cap holds, and a real
request still gets through a flood of idle connections (issue 26, item 9). A real aiohttp
server over TLS on loopback, in this process."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from egpu_testing.workbench import TestPki, metric_value
from elastic_gpu.core.connlimits import ConnectionLimits, Room, effective_cap, make_room
from elastic_gpu.runtime.http_connections import (
    ConnectionGate,
    GateCollector,
    GatedSite,
    gated_app,
)


def test_make_room_sheds_the_oldest_idle_never_a_busy_one() -> None:
    assert make_room(2, ["a", "b"], 4) == Room((), False)
    assert make_room(4, ["a", "b"], 4) == Room(("a",), False)
    assert make_room(4, [], 4) == Room((), True)
    assert make_room(5, ["a"], 4) == Room((), True)  # one would not be enough: keep it
    assert effective_cap(1024, 256) == 128 and effective_cap(1024, None) == 1024
    assert effective_cap(1024, 100) == 1
    with pytest.raises(ValueError, match="max_connections"):
        ConnectionLimits(max_connections=0)


async def _serve(pki: TestPki, limits: ConnectionLimits, slow: asyncio.Event
                 ) -> AsyncIterator[tuple[int, ConnectionGate]]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def wait(_: web.Request) -> web.Response:
        await slow.wait()
        return web.Response(text="late")

    async def length(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/slow", wait)
    app.router.add_post("/length", length)
    gate = ConnectionGate(limits, fds=None)
    runner = web.AppRunner(gated_app(app, gate))
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    site = GatedSite(runner, "127.0.0.1", 0, gate=gate, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port, gate
    finally:
        await runner.cleanup()


def _client_context(pki: TestPki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca))


async def _get(port: int, pki: TestPki, path: str = "/") -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_client_context(pki))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data.decode(errors="replace")


async def _until(condition: object, what: str, deadline_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not condition():  # type: ignore[operator]
        assert loop.time() < end, f"not within {deadline_s} s: {what}"
        await asyncio.sleep(0.05)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_idle_connections_are_closed_and_a_request_gets_through_the_flood(tmp_path: Path,
                                                                         loop: str) -> None:
    """On both event loops the servers may run on (`runtime.eventloop`)."""
    pki = TestPki.create(tmp_path)

    async def scenario() -> None:
        slow = asyncio.Event()
        serving = _serve(pki, ConnectionLimits(header_timeout_s=1.0, idle_timeout_s=1.0,
                                               max_connections=40), slow)
        port, gate = await serving.__anext__()
        try:
            # the flood: TLS connections that never send a request, and bare TCP
            # connections that never start TLS, each more than the cap; the oldest idle ones
            # make room for new ones, so the server stays at the cap. On a busy machine the
            # TLS handshakes can outlast the 1 s header timeout, which then closes some first;
            # the 60 bare connections arrive in one burst, so at least 20 are shed for room
            tls = [await asyncio.open_connection("127.0.0.1", port, ssl=_client_context(pki))
                   for _ in range(60)]
            raw = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
            await _until(lambda: gate.shed >= 20 and gate.shed + gate.timeouts >= 80,
                         "the oldest idle connections shed")
            assert gate.open_count <= gate.cap
            # the component's /metrics page counts them (GateCollector)
            await _until(lambda: gate.accepted_count == 120, "every connection accepted")
            registry = CollectorRegistry()
            registry.register(GateCollector(gate, "egpu_test_"))
            page = generate_latest(registry).decode()
            assert metric_value(page, 'egpu_test_connections_total{outcome="accepted"}') == 120
            assert metric_value(page, 'egpu_test_connections_total{outcome="shed"}') == gate.shed
            assert metric_value(page, 'egpu_test_connections_total{outcome="idle_timeout"}') \
                == gate.timeouts
            assert metric_value(page, "egpu_test_connections_open") == gate.open_count
            # and a real request gets through it at once
            assert (await _get(port, pki)).endswith("ok")
            # a request in progress is never closed for room or for idleness
            busy = asyncio.create_task(_get(port, pki, "/slow"))
            await _until(lambda: any(c.busy for c in gate._open), "the slow request started")
            more = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
            raw += more
            # every idle connection is closed by the server (for room, or by the timeouts)
            await _until(lambda: all(_closed_by_peer(s) for s in raw),
                         "idle TCP connections closed by the server")
            await _until(lambda: all(r.at_eof() or r.exception() for r, _ in tls),
                         "idle TLS connections closed by the server")
            # once the flood is gone, requests are served again
            await _until(lambda: gate.open_count <= 1, "the flood's connections forgotten")
            assert (await _get(port, pki)).endswith("ok")
            slow.set()
            assert (await busy).endswith("late")
            await _until(lambda: gate.open_count == 0, "no connection left open")
            for sock in raw:
                sock.close()
            for _, writer in tls:
                writer.close()
        finally:
            await serving.aclose()

    if loop == "uvloop":
        import uvloop

        uvloop.run(scenario())
    else:
        asyncio.run(scenario())


def test_aiohttps_handler_gets_its_body_within_the_limit_or_the_client_408(tmp_path: Path) -> None:
    """The webhook's connections (aiohttp's handler): a handler still waiting for its body
    past `body_timeout_s` is cancelled and the client answered 408, its connection closed; a
    body that comes in parts, in time, is served."""
    pki = TestPki.create(tmp_path)

    async def scenario() -> None:
        serving = _serve(pki, ConnectionLimits(body_timeout_s=0.5), asyncio.Event())
        port, gate = await serving.__anext__()
        try:
            head = b"POST /length HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n"
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           ssl=_client_context(pki))
            writer.write(head + b"x" * 100)  # then nothing
            answer = (await asyncio.wait_for(reader.read(), 30)).decode()  # to its close
            assert answer.startswith("HTTP/1.1 408 ")
            assert "did not arrive within 0.5 s of its headers (bodyTimeoutSeconds)" in answer
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           ssl=_client_context(pki))
            writer.write(head + b"x" * 400)
            await asyncio.sleep(0.2)
            writer.write(b"x" * 500)
            answer = (await asyncio.wait_for(reader.readuntil(b"900"), 30)).decode()
            assert answer.startswith("HTTP/1.1 200 ")  # the handler read the body it was given
            writer.close()
            registry = CollectorRegistry()
            registry.register(GateCollector(gate, "egpu_test_"))
            page = generate_latest(registry).decode()
            assert metric_value(page, "egpu_test_request_body_timeouts_total") == 1
        finally:
            await serving.aclose()

    asyncio.run(scenario())
