"""The one `/metrics` page of every component (docs/metrics.md): the extender and the webhook
add it to their own aiohttp app, the controller to its metrics-and-health app, the agent
(threads, no event loop) serves it on a thread of its own (`MetricsThread`).

One page, so that every component answers a scrape the same way: Prometheus' text format, or
OpenMetrics when the scraper asks for it (`Accept`, prometheus_client's own negotiation), with
the content type that goes with the body (the webhook once answered a fixed version string).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

PATH = "/metrics"

Handler = Callable[[web.Request], Awaitable[web.Response]]


def metrics_page(registry: CollectorRegistry,
                 refresh: Callable[[], None] | None = None) -> Handler:
    """The `/metrics` handler of `registry`; `refresh` runs first (gauges set on scrape)."""

    async def page(request: web.Request) -> web.Response:
        body, content_type = exposition(registry, request.headers.get("Accept", ""), refresh)
        return web.Response(body=body, headers={"Content-Type": content_type})

    return page


def exposition(registry: CollectorRegistry, accept: str,
               refresh: Callable[[], None] | None = None) -> tuple[bytes, str]:
    """The page's body and content type for a scraper's `Accept` (either HTTP version)."""
    if refresh is not None:
        refresh()
    encode, content_type = choose_encoder(accept)
    return encode(registry), content_type


def add_metrics(app: web.Application, registry: CollectorRegistry,
                refresh: Callable[[], None] | None = None) -> None:
    """Serve `registry` at `/metrics` of `app`."""
    app.router.add_get(PATH, metrics_page(registry, refresh))


class MetricsThread:
    """`/metrics` of `registry` on `host:port` for a component without an event loop: an
    event loop on a daemon thread of its own, serving the same page."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Listen (port 0 picks a free one) and return the port bound; errors (the port in
        use) are raised here, in the caller's thread."""
        loop = asyncio.new_event_loop()
        app = web.Application()
        add_metrics(app, self.registry)
        runner = web.AppRunner(app, access_log=None)

        async def listen() -> int:
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            return int(runner.addresses[0][1])

        try:
            bound = loop.run_until_complete(listen())
        except BaseException:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            raise
        self._loop, self._runner = loop, runner
        self._thread = threading.Thread(target=loop.run_forever, name="metrics", daemon=True)
        self._thread.start()
        return bound

    def stop(self) -> None:
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is None or runner is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._runner = self._thread = None
