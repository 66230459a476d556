"""The extender's HTTP routes: filter, prioritize, bind, preempt, provision, health,
readiness, metrics; bodies read within their limits, answers tagged with their outcome.

Every answer is either the verb's result, an `Error` kube-scheduler shows to the user (for
pods we cannot place: a reason a person can act on), or a 4xx for bodies kube-scheduler would
never send: every body is validated once, completely, by `wire` (bounded types), so nothing
past it meets an unexpected type. A last-resort handler still logs any exception and answers
500, so a bug never kills the server, but no input is meant to reach it.

Cost of one request is bounded (docs/scheduler.md, "HTTP limits"): a body over
`maxRequestBytes` gets 413 before it is read; bodies over `LARGE_BODY_BYTES` (or of unknown
length) are read, decoded, planned and encoded in a worker thread, at most `HEAVY_SLOTS` at a
time with `HEAVY_QUEUE` more waiting (then 429), so health checks, small filters and binds keep
flowing on the event loop.

`egpu scheduler` serves these routes through the gate's own protocol servers
(`runtime.http1`, and `runtime.http2` where TLS negotiates it): `AppRoutes` is the routes as
their `HttpApp`, answering with the same code (`HttpRoutes.answer` and `serve_body`, the body
collected by the protocol within the same limits). The aiohttp app (`HttpRoutes.app`) serves
the same routes to aiohttp's own runners (the health port, tests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from aiohttp import web

from elastic_gpu.runtime import httpapp
from elastic_gpu.runtime.metrics import PATH, page_response
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.handle import (
    HEAVY_QUEUE,
    HEAVY_SLOTS,
    LARGE_BODY_BYTES,
    LARGE_NODE_COUNT,
    Handle,
)
from elastic_gpu.scheduler.state import StateNotReady

log = logging.getLogger(__name__)

#: A bind's body is four names.
BIND_BODY_BYTES = 64 * 1024
#: The verbs whose body is a few names (`BIND_BODY_BYTES`), always read on the event loop.
SMALL_VERBS = frozenset({"bind", "provision"})


class BodyTooLarge(Exception):
    """More bytes than the limit; the message says how many and which limit."""


class _Busy(Exception):
    """Too many large requests at once (429)."""


def _too_large(size: int, limit: int, verb: str) -> str:
    which = "a bind's body is four names" if verb == "bind" else \
        "a provision's body is three names" if verb == "provision" else \
        "maxRequestBytes; nodeCacheCapable: true sends names, not Node objects"
    return f"request body of {size} bytes is over the limit of {limit} bytes ({which})"


async def _read(request: web.Request, limit: int, verb: str) -> bytes:
    """The body, refused (BodyTooLarge) as soon as more than `limit` bytes arrived."""
    chunks = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(size, limit, verb) + " (the rest was not read)")
        chunks.append(chunk)
    return b"".join(chunks)


#: The outcome of an answer by its status, when the verb did not name one.
_STATUS_OUTCOMES = {400: "bad_request", 413: "bad_request", 429: "busy", 503: "not_ready",
                    500: "internal_error"}
_OUTCOME = web.ResponseKey("outcome", str)


def with_outcome(response: web.Response, outcome: str) -> web.Response:
    """Tag an answer with its outcome (`elasticgpu_scheduler_requests_total{outcome}`)."""
    response[_OUTCOME] = outcome
    return response


def response_outcome(response: web.Response) -> str:
    """The outcome an answer was tagged with; else by its status: 2xx ok, 4xx/5xx by code."""
    tagged: str | None = response.get(_OUTCOME)
    if tagged is not None:
        return tagged
    if response.status < 400:
        return "ok"
    return _STATUS_OUTCOMES.get(response.status, "error")


def json_answer(data: Any, status: int = 200) -> web.Response:
    # msgspec: a 5,000-node answer encodes in well under a millisecond (stdlib json: ~5 ms)
    return web.Response(body=msgspec.json.encode(data), status=status,
                        content_type="application/json")


#: A verb's handler: the request's body in, the answer out (bind and provision await the API).
Handler = Callable[[bytes], Awaitable[web.Response] | web.Response]


class HttpRoutes:
    """The routes of the verbs, health and readiness, and where each request runs: the event
    loop or a worker thread, a few large ones at a time."""

    def __init__(self, handle: Handle) -> None:
        self._handle = handle
        self._heavy_slots = asyncio.Semaphore(HEAVY_SLOTS)
        #: large requests in progress or waiting for a slot
        self.heavy_waiting = 0
        #: one `/metrics` page written at a time (`page`)
        self._page_slot = asyncio.Lock()

    def _timed(self, verb: str, handler: Handler
               ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return await self.answer(verb, lambda: self._serve(verb, request, handler))
        return handle

    async def answer(self, verb: str, serve: Callable[[], Awaitable[web.Response]]
                     ) -> web.Response:
        """A verb's answer over either protocol: refused by a standby, errors turned into
        their status, timed and counted."""
        metrics = self._handle.metrics
        started = time.perf_counter()
        role = self._handle.role
        try:
            if not role.serving:  # a standby, or a leader that lost its Lease
                response = with_outcome(json_answer({"Error": role.refusal},
                                                    status=503), "standby")
            else:
                response = await serve()
        except wire.WireError as err:
            metrics.bad_requests.labels(verb).inc()
            response = json_answer({"Error": str(err)}, status=400)
        except BodyTooLarge as err:
            metrics.bad_requests.labels(verb).inc()
            response = json_answer({"Error": str(err)}, status=413)
        except _Busy as err:
            response = json_answer({"Error": str(err)}, status=429)
            response.headers["Retry-After"] = "1"
        except StateNotReady as err:
            response = json_answer({"Error": str(err)}, status=503)
        except Exception as err:  # last resort: a bug must not kill the server
            log.exception("%s: unexpected error", verb)
            response = json_answer({"Error": f"internal error in the extender ({type(err).__name__}"
                                       "; see its log)"}, status=500)
        finally:
            metrics.latency.labels(verb).observe(time.perf_counter() - started)
        metrics.requests.labels(verb, response_outcome(response)).inc()
        return response

    def body_limit(self, verb: str) -> int:
        return BIND_BODY_BYTES if verb in SMALL_VERBS else self._handle.limits.max_body_bytes

    async def _serve(self, verb: str, request: web.Request, handler: Handler) -> web.Response:
        if verb == "filter":
            # backpressure: kube-scheduler's next cycle waits while its binds pile up
            await self._handle.binds.room()
        limit = self.body_limit(verb)
        length = request.content_length
        if length is not None and length > limit:  # refused before a byte of it is read
            raise BodyTooLarge(_too_large(length, limit, verb))
        if verb in SMALL_VERBS or (length is not None and length <= LARGE_BODY_BYTES):
            return await self._run(verb, await _read(request, limit, verb), handler)
        return await self._heavy(lambda: _read(request, limit, verb), handler)

    async def serve_body(self, verb: str, body: bytes, handler: Handler) -> web.Response:
        """`_serve` of a body already read within `body_limit` (HTTP/2 collects it)."""
        if verb == "filter":
            await self._handle.binds.room()
        if verb in SMALL_VERBS or len(body) <= LARGE_BODY_BYTES:
            return await self._run(verb, body, handler)

        async def read() -> bytes:
            return body
        return await self._heavy(read, handler)

    async def _run(self, verb: str, body: bytes, handler: Handler) -> web.Response:
        # A small body may still name many nodes (planning them is the cost), and while a
        # verb runs in a thread it may hold the state's lock: then leave the loop too.
        many_names = body.count(b'"') > 2 * LARGE_NODE_COUNT
        if verb not in SMALL_VERBS and (self._handle.calls.in_threads or many_names):
            return await self._in_thread(handler, body)
        result = handler(body)
        return await result if isinstance(result, Awaitable) else result

    async def _heavy(self, read: Callable[[], Awaitable[bytes]], handler: Handler
                     ) -> web.Response:
        """Large (or of unknown length): a few at a time, the rest wait or are turned away."""
        if self.heavy_waiting >= HEAVY_SLOTS + HEAVY_QUEUE:
            raise _Busy(f"{self.heavy_waiting} large requests are in progress or waiting; "
                        "retry shortly")
        self.heavy_waiting += 1
        try:
            async with self._heavy_slots:
                return await self._in_thread(handler, await read())
        finally:
            self.heavy_waiting -= 1

    async def _in_thread(self, handler: Handler, body: bytes) -> web.Response:
        calls = self._handle.calls
        calls.in_threads += 1
        try:
            result = await asyncio.to_thread(handler, body)
        finally:
            calls.in_threads -= 1
        assert isinstance(result, web.Response)  # only the synchronous verbs come here
        return result

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        return self.readiness()

    def readiness(self) -> web.Response:
        role, state = self._handle.role, self._handle.state
        if not role.serving:  # a standby says whether its caches are warm
            warm = "caches synced" if state.ready else state.not_ready_reason()
            return web.Response(text=f"{role.phase}; {warm}", status=503)
        if state.ready:
            return web.Response(text="ok")
        return web.Response(text=state.not_ready_reason(), status=503)

    async def page(self, accept: str) -> tuple[list[bytes], str]:
        """The `/metrics` page (body, content type) for a scraper's `Accept`, over either
        protocol, one scrape at a time (others wait their turn). The page has series per card
        and per share, ~9 MB and ~65 ms of CPU at 1,000 nodes of 8 cards, ~1 s at 15,000:
        written in one go it would stall every verb that long, so it is written in pieces
        with the verbs answered in between (`runtime.metrics.written_page`)."""
        async with self._page_slot:
            return await self._handle.metrics.pieces(accept)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        pieces, content_type = await self.page(request.headers.get("Accept", ""))
        return await page_response(request, pieces, content_type)

    def count_too_large(self, verb: str) -> None:
        """A body refused for its size where `answer` did not run (HTTP/2 refuses it as it
        arrives), counted as `answer` counts it."""
        self._handle.metrics.bad_requests.labels(verb).inc()
        self._handle.metrics.requests.labels(verb, "bad_request").inc()

    def http_app(self, handlers: Mapping[str, Handler], prefix: str = "") -> AppRoutes:
        """The same routes for the gate's own protocol servers (`runtime.httpapp.HttpApp`)."""
        return AppRoutes(self, handlers, prefix)

    def app(self, handlers: Mapping[str, Handler], prefix: str = "") -> web.Application:
        """The application serving `handlers` (by verb) under `prefix`, health, readiness
        and metrics."""
        app = web.Application(client_max_size=self._handle.limits.max_body_bytes)
        for verb, handler in handlers.items():
            app.router.add_post(f"{prefix}/{verb}", self._timed(verb, handler))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get(PATH, self.metrics)
        return app


class AppRoutes:
    """`HttpRoutes` as the gate's protocol servers ask them (`runtime.httpapp.HttpApp`, over
    HTTP/1.1 and HTTP/2): the verbs, health, readiness and metrics, answered by the very code
    the aiohttp routes run."""

    def __init__(self, routes: HttpRoutes, handlers: Mapping[str, Handler], prefix: str) -> None:
        self._routes = routes
        self._verbs = {f"{prefix}/{verb}": (verb, handler) for verb, handler in handlers.items()}

    def body_limit(self, method: str, path: str) -> int:
        found = self._verbs.get(path)
        return self._routes.body_limit(found[0]) if found is not None and method == "POST" else 0

    def too_large(self, method: str, path: str, size: int) -> httpapp.Answer:
        found = self._verbs.get(path)
        if found is None and path not in _GETS:
            return _answer(web.Response(status=404, text="404: Not Found"))
        if found is None or method != "POST":
            return _answer(json_answer({"Error": f"{method} {path} takes no body"}, status=413))
        self._routes.count_too_large(found[0])
        limit = self._routes.body_limit(found[0])
        return _answer(json_answer({"Error": _too_large(size, limit, found[0]) +
                                    " (the rest was not read)"}, status=413))

    async def respond(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> httpapp.Answer:
        found = self._verbs.get(path)
        if found is not None:
            if method != "POST":
                return _answer(web.Response(status=405, headers={"Allow": "POST"}))
            verb, handler = found
            return _answer(await self._routes.answer(
                verb, lambda: self._routes.serve_body(verb, body, handler)))
        if method != "GET":
            return _answer(web.Response(status=404 if path not in _GETS else 405))
        if path == "/healthz":
            return _answer(web.Response(text="ok"))
        if path == "/readyz":
            return _answer(self._routes.readiness())
        if path == PATH:
            page, content_type = await self._routes.page(headers.get("accept", ""))
            return 200, [("content-type", content_type)], page
        return _answer(web.Response(status=404, text="404: Not Found"))


#: the paths answered to GET
_GETS = frozenset({"/healthz", "/readyz", PATH})
#: headers of aiohttp's answers that are HTTP/1.1's own (RFC 9113 8.2.2) or set by the sender
_NOT_H2 = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade",
                     "content-length"})


def _answer(response: web.Response) -> httpapp.Answer:
    """An aiohttp answer as the protocol servers send it (the framing is theirs)."""
    body = response.body
    assert isinstance(body, bytes | bytearray | None), type(body)  # our answers are bytes
    headers = [(name.lower(), value) for name, value in response.headers.items()
               if name.lower() not in _NOT_H2]
    return response.status, headers, bytes(body or b"")
