"""The one `/metrics` page of every component (docs/metrics.md): the extender and the webhook
add it to their own aiohttp app, the controller to its metrics-and-health app, the agent
(threads, no event loop) serves it on a thread of its own (`MetricsThread`).

One page, so that every component answers a scrape the same way: Prometheus' text format, or
OpenMetrics when the scraper asks for it (`Accept`, prometheus_client's own negotiation), with
the content type that goes with the body (the webhook once answered a fixed version string).

A component with many series of one label set (the extender: five gauges per card of every
node, two per share of every pod) writes those families itself (`GaugeText`, `PageText`),
line for line as prometheus_client would write them: its `GaugeMetricFamily` and
`generate_latest` build a Sample and escape every label of every series, ~8 us a series, so a
scrape of 1,000 nodes of 8 cards took ~0.45 s of the event loop (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

PATH = "/metrics"
#: The line that ends an OpenMetrics page; a component's own families go before it.
_OPENMETRICS_EOF = b"# EOF\n"

Handler = Callable[[web.Request], Awaitable[web.Response]]
#: Complete gauge families a component writes itself (`GaugeText`), added to its page, in
#: pieces of encoded text: an empty piece is a point where a writer on an event loop lets
#: other work run (`written_page`).
PageText = Callable[[], Iterable[bytes]]
#: A family's lines are encoded this many at a time (~0.6 MB of per-card series): the writing
#: and encoding of a large page is spread over its pieces, never one step at the end.
LINES_PER_CHUNK = 4096


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


async def written_page(registry: CollectorRegistry, accept: str,
                       text: PageText) -> tuple[list[bytes], str]:
    """`exposition` of `registry` with the families `text` writes after its own, on an event
    loop, letting other work run at each empty piece of `text`: a page of many series (the
    extender's: ~65 ms of writing at 1,000 nodes of 8 cards, ~0.3 s at 5,000) is written
    between the verbs, never in their way. The page comes in pieces, to be sent one after
    another (`page_response`): joined in one copy, 130 MB at 15,000 nodes took ~60 ms more of
    the event loop."""
    body, content_type = exposition(registry, accept)
    pieces: list[bytes] = []
    for piece in text():
        if piece:
            pieces.append(piece)
        else:
            await asyncio.sleep(0)
    return _with_own(body, pieces), content_type


def _with_own(body: bytes, pieces: list[bytes]) -> list[bytes]:
    """The registry's page with the component's pieces after its families (before
    OpenMetrics' closing line)."""
    if body.endswith(_OPENMETRICS_EOF):
        return [body[:-len(_OPENMETRICS_EOF)], *pieces, _OPENMETRICS_EOF]
    return [body, *pieces]


async def page_response(request: web.Request, pieces: list[bytes],
                        content_type: str) -> web.StreamResponse:
    """A page in pieces sent over HTTP/1.1, one after another as the connection takes them
    (each write waits while the transport's buffer is full, and other work runs meanwhile).
    A HEAD request gets the headers alone: a streamed answer's writes are not dropped for it
    as a whole `web.Response`'s body is, and a body after them would be read as the next
    answer on the connection."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    response.content_length = sum(len(piece) for piece in pieces)
    await response.prepare(request)
    if request.method != "HEAD":
        for piece in pieces:
            await response.write(piece)
    await response.write_eof()
    return response


def add_metrics(app: web.Application, registry: CollectorRegistry,
                refresh: Callable[[], None] | None = None) -> None:
    """Serve `registry` at `/metrics` of `app` (the extender serves its larger page with
    `written_page`, `scheduler.http`)."""
    app.router.add_get(PATH, metrics_page(registry, refresh))


def label_text(pairs: Iterable[tuple[str, str]]) -> str:
    """A series' label set as both formats write it: `{a="x",b="y"}`, names in order, values
    escaped (backslash, newline, double quote)."""
    return "{" + ",".join(f'{name}="{_escape_value(value)}"'
                          for name, value in sorted(pairs)) + "}"


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return value


#: prometheus_client's formatting of a value (Go's: `1000.0`, `8.589934592e+010`), untyped there
_go_float: Callable[[float], str] = floatToGoString


@functools.lru_cache(maxsize=4096)
def _number(value: float) -> str:
    # a page repeats few values (capacities, 0, 1): each is formatted once
    return _go_float(value)


class GaugeText:
    """One gauge family's text, as prometheus_client writes a `GaugeMetricFamily` in either
    format (its HELP and TYPE lines even with no series), encoded `LINES_PER_CHUNK` lines at a
    time as its series are added."""

    def __init__(self, name: str, documentation: str) -> None:
        if '"' in documentation or "\\" in documentation or "\n" in documentation:
            # the two formats escape these differently in HELP: none is written
            raise ValueError(f"{name}: its documentation holds a quote, backslash or newline")
        self._name = name
        self._lines = [f"# HELP {name} {documentation}\n# TYPE {name} gauge\n"]
        self._chunks: list[bytes] = []

    def add(self, labels: str, value: float) -> None:
        """A series: `labels` as `label_text` writes them."""
        self._lines.append(f"{self._name}{labels} {_number(value)}\n")
        if len(self._lines) >= LINES_PER_CHUNK:
            self._flush()

    def _flush(self) -> None:
        self._chunks.append("".join(self._lines).encode())
        self._lines.clear()

    def chunks(self) -> list[bytes]:
        """The family's text, encoded, in order (the family ends with it: nothing is added
        after)."""
        if self._lines:
            self._flush()
        return self._chunks


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
