"""`devcluster.readyproxy`: new connections go to the ready backends in turn (a Service's
endpoints as kube-proxy spreads them), never to one whose /readyz is not 200, and to the rest
once one dies. Real loopback sockets and HTTP servers on both sides."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest
from aiohttp import web

from elastic_gpu.devcluster.readyproxy import Backend, ReadyForwarder


class NamedServer:
    """An HTTP server answering `/who` with its name and `/readyz` with `status`, on a loop
    of its own."""

    def __init__(self, name: str, status: int = 200) -> None:
        self.name = name
        self.status = status
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def who(_: web.Request) -> web.Response:
            return web.Response(text=self.name)

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(status=self.status)

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/who", who)
            app.router.add_get("/readyz", readyz)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def stop(self) -> None:
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def servers() -> Iterator[list[NamedServer]]:
    made = [NamedServer("a"), NamedServer("b"), NamedServer("c", status=503)]
    yield made
    for server in made:
        server.stop()


def _who(url: str) -> str:
    # a new connection each time (urllib closes it): each one is routed afresh
    with urllib.request.urlopen(f"{url}/who", timeout=5) as response:
        return str(response.read().decode())


def _wait_ready(forwarder: ReadyForwarder, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(forwarder.ready) != count:
        assert time.monotonic() < deadline, forwarder.ready
        time.sleep(0.02)


def test_connections_are_spread_over_the_ready_backends_and_leave_a_dead_one(
        servers: list[NamedServer]) -> None:
    forwarder = ReadyForwarder([Backend.parse(f"127.0.0.1:{s.port}") for s in servers],
                               poll_s=0.05).start_in_thread()
    try:
        _wait_ready(forwarder, 2)
        seen = Counter(_who(forwarder.url) for _ in range(10))
        assert seen == {"a": 5, "b": 5}  # in turn; "c" is not ready and gets none

        servers[0].stop()  # "a" dies: once the forwarder sees it, every connection goes to "b"
        _wait_ready(forwarder, 1)
        assert Counter(_who(forwarder.url) for _ in range(4)) == {"b": 4}
    finally:
        forwarder.stop()


def test_with_no_ready_backend_a_connection_is_closed_at_once(
        servers: list[NamedServer]) -> None:
    forwarder = ReadyForwarder([Backend.parse(f"127.0.0.1:{servers[2].port}")],
                               poll_s=0.05).start_in_thread()
    try:
        time.sleep(0.2)
        assert forwarder.ready == ()
        with pytest.raises(OSError):
            _who(forwarder.url)
        assert forwarder.refused == 1
    finally:
        forwarder.stop()
