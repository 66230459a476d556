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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from aiohttp import web

from elastic_gpu.runtime.metrics import add_metrics
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
        self._heavy = asyncio.Semaphore(HEAVY_SLOTS)
        #: large requests in progress or waiting for a slot
        self.heavy_waiting = 0

    def _timed(self, verb: str, handler: Handler
               ) -> Callable[[web.Request], Awaitable[web.Response]]:
        metrics = self._handle.metrics

        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            role = self._handle.role
            try:
                if not role.serving:  # a standby, or a leader that lost its Lease
                    response = with_outcome(json_answer({"Error": role.refusal},
                                                        status=503), "standby")
                else:
                    response = await self._serve(verb, request, handler)
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
        return handle

    async def _serve(self, verb: str, request: web.Request, handler: Handler) -> web.Response:
        if verb == "filter":
            # backpressure: kube-scheduler's next cycle waits while its binds pile up
            await self._handle.binds.room()
        small = verb in ("bind", "provision")
        limit = BIND_BODY_BYTES if small else self._handle.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:  # refused before a byte of it is read
            raise BodyTooLarge(_too_large(length, limit, verb))
        if small or (length is not None and length <= LARGE_BODY_BYTES):
            body = await _read(request, limit, verb)
            # A small body may still name many nodes (planning them is the cost), and while a
            # verb runs in a thread it may hold the state's lock: then leave the loop too.
            many_names = body.count(b'"') > 2 * LARGE_NODE_COUNT
            if not small and (self._handle.calls.in_threads or many_names):
                return await self._in_thread(handler, body)
            result = handler(body)
            return await result if isinstance(result, Awaitable) else result
        # Large (or of unknown length): a few at a time, the rest wait or are turned away.
        if self.heavy_waiting >= HEAVY_SLOTS + HEAVY_QUEUE:
            raise _Busy(f"{self.heavy_waiting} large requests are in progress or waiting; "
                        "retry shortly")
        self.heavy_waiting += 1
        try:
            async with self._heavy:
                body = await _read(request, limit, verb)
                return await self._in_thread(handler, body)
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
        role, state = self._handle.role, self._handle.state
        if not role.serving:  # a standby says whether its caches are warm
            warm = "caches synced" if state.ready else state.not_ready_reason()
            return web.Response(text=f"{role.phase}; {warm}", status=503)
        if state.ready:
            return web.Response(text="ok")
        return web.Response(text=state.not_ready_reason(), status=503)

    def app(self, handlers: Mapping[str, Handler], prefix: str = "") -> web.Application:
        """The application serving `handlers` (by verb) under `prefix`, health, readiness
        and metrics."""
        app = web.Application(client_max_size=self._handle.limits.max_body_bytes)
        for verb, handler in handlers.items():
            app.router.add_post(f"{prefix}/{verb}", self._timed(verb, handler))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        add_metrics(app, self._handle.metrics.registry)
        return app
