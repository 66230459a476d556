"""A TCP forwarder to whichever backend's /readyz answers 200: the development control plane's
stand-in for a Service and kube-proxy.

In a cluster, kube-scheduler reaches the extender through a Service; its endpoints are the
ready pods (kubelet's readiness probe on /readyz), and kube-proxy sends each new connection to
one of them. The dev control plane runs no kube-proxy, so the sandbox
(`egpu sandbox up --extender-replicas 2`) and the failover tests put this in front of the
replicas instead: it asks every backend's /readyz every `poll_s` and sends each new connection
to the next ready one in turn, byte for byte (TLS passes through untouched). The extender's
replicas have one ready backend at a time (readiness is leadership); the webhook's are all
ready, and their connections are spread over them as kube-proxy spreads a Service's. With no
ready backend a connection is closed at once, as a Service without endpoints refuses it:
kube-scheduler retries the pod. Connections already open stay with their backend until it
closes them, as with kube-proxy. An HTTPS /readyz is asked without verifying the certificate,
as kubelet's HTTPS probes do.

It reacts faster than the real path (a readiness probe's period plus endpoint propagation,
about 1-2 s with the chart's probe): failover times measured behind it leave that out.

    python -m elastic_gpu.devcluster.readyproxy --port 8888 --backend 127.0.0.1:18888 \
        --backend 127.0.0.1:18889 [--health http://127.0.0.1:19888 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backend:
    host: str
    port: int
    #: where its /readyz is asked (plain HTTP: the extender's --health-port with mutual TLS)
    health_url: str

    @classmethod
    def parse(cls, address: str, health_url: str | None = None) -> Backend:
        host, _, port = address.rpartition(":")
        return cls(host or "127.0.0.1", int(port),
                   health_url or f"http://{host or '127.0.0.1'}:{port}")


class ReadyForwarder:
    """Serve on `host:port`, forwarding each new connection to the next ready backend in turn.
    `serve` runs it on the current event loop; `start_in_thread` on a loop of its own (tests
    and benches)."""

    def __init__(self, backends: Sequence[Backend], host: str = "127.0.0.1", port: int = 0,
                 poll_s: float = 0.1) -> None:
        if not backends:
            raise ValueError("a forwarder needs at least one backend")
        self.backends = tuple(backends)
        self.host = host
        self.port = port
        self.poll_s = poll_s
        #: the backends new connections go to, in turn (empty: none is ready)
        self.ready: tuple[Backend, ...] = ()
        self._turn = itertools.count()
        self.forwarded = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    async def _ready(self, session: aiohttp.ClientSession, backend: Backend) -> bool:
        try:
            async with session.get(f"{backend.health_url}/readyz", ssl=False) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _watch(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(0.5, 5 * self.poll_s))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                found = await asyncio.gather(*(self._ready(session, b) for b in self.backends))
                ready = tuple(b for b, ok in zip(self.backends, found, strict=True) if ok)
                if ready != self.ready:
                    log.info("forwarding to %s", ", ".join(f"{b.host}:{b.port}" for b in ready)
                             or "nobody (no backend is ready)")
                    self.ready = ready
                await asyncio.sleep(self.poll_s)

    def _next_backend(self) -> Backend | None:
        """The ready backend whose turn it is (None: none is ready)."""
        ready = self.ready
        return ready[next(self._turn) % len(ready)] if ready else None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(ConnectionError, OSError):  # either side went away
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
        finally:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        backend = self._next_backend()
        if backend is None:
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(backend.host, backend.port)
        except OSError:
            self.refused += 1
            writer.close()
            return
        self.forwarded += 1
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def serve(self, started: threading.Event | None = None) -> None:
        """Forward until cancelled (or `stop`)."""
        self._stopping = asyncio.Event()
        watcher = asyncio.create_task(self._watch(), name="readiness")
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("forwarding %s:%d to the ready ones of %s", self.host, self.port,
                 ", ".join(f"{b.host}:{b.port}" for b in self.backends))
        if started is not None:
            started.set()
        try:
            await self._stopping.wait()
        finally:
            watcher.cancel()
            self._server.close()
            await asyncio.gather(watcher, return_exceptions=True)

    def start_in_thread(self, timeout_s: float = 10.0) -> ReadyForwarder:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve(started))
            self._loop.close()

        self._thread = threading.Thread(target=run, name="ready-forwarder", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s):
            raise TimeoutError("the forwarder did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True,
                        help="host:port of a replica (repeat)")
    parser.add_argument("--health", action="append", default=[],
                        help="base URL of each backend's /readyz, in --backend order "
                             "(default: http://<backend>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s readyproxy %(message)s")
    health = list(args.health) + [None] * (len(args.backend) - len(args.health))
    backends = [Backend.parse(b, h) for b, h in zip(args.backend, health, strict=False)]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(ReadyForwarder(backends, args.host, args.port).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
