"""What the gate's own protocol servers (`http1`, `http2`) answer with, and share.

The extender answers its requests through these servers rather than aiohttp's handler
(docs/scheduler.md, "The extender's HTTP servers"): an `HttpApp` is told a request's method,
path, headers and whole body, and returns an `Answer`; the protocol around it (framing,
limits, keep-alive, flow control) is the server's. `BodyBudget` bounds the request bodies every
connection of one server may hold at once, over both protocols together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: Bytes of request bodies buffered at once over every connection of a server (`BodyBudget`):
#: a request that would go past it is refused (HTTP/2: REFUSED_STREAM; HTTP/1.1: 429), and the
#: client may retry it. Four of the extender's largest requests (`maxRequestBytes`, 16 MiB by
#: default).
MAX_BUFFERED = 64 * 1024 * 1024

#: (status, headers with lower-case names, body: bytes, or pieces sent one after another)
Answer = tuple[int, Sequence[tuple[str, str]], bytes | list[bytes]]


class HttpApp(Protocol):
    """What answers the requests of the gate's own protocol servers."""

    def body_limit(self, method: str, path: str) -> int:
        """The most bytes of body a request to `path` may send (0: none)."""
        ...

    def too_large(self, method: str, path: str, size: int) -> Answer:
        """The answer to a body past `body_limit` (it is not read further)."""
        ...

    async def respond(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> Answer: ...


class Busy(Protocol):
    """The gate's view of the connection: requests in progress (`http_connections`).

    A request is in progress from its headers to its answer, and the gate's idle timer leaves
    its connection alone meanwhile; the server itself bounds the time its body takes to arrive
    (`body_timeout_s`): past it the request is answered 408 and read no further."""

    @property
    def body_timeout_s(self) -> float: ...

    def request_started(self) -> None: ...

    def request_finished(self) -> None: ...

    def body_timed_out(self) -> None:
        """Counted: a request's body did not arrive within `body_timeout_s`."""
        ...


def body_late(seconds: float) -> str:
    """The reason of a 408: the body did not arrive within `Busy.body_timeout_s`."""
    return (f"the request's body did not arrive within {seconds:g} s of its headers "
            "(bodyTimeoutSeconds)")


class BodyBudget:
    """The bytes of request bodies a server's connections may hold at once, together: the
    protocol servers collect each body whole before the app sees it, so the bound is on what
    is buffered (a large body is then planned in one of a few slots, `scheduler.http`)."""

    def __init__(self, limit: int = MAX_BUFFERED) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size
