"""How many connections a server holds, and for how long one may sit idle.

Both servers (the extender, the webhook) kept every connection open until the client closed
it: 1,200 idle TLS connections stayed 60 s, and at the file-descriptor limit new connections
were reset (issue 26, item 9). The bounds are Go's http.Server's, with kube-apiserver's values
as defaults: a connection must finish its TLS handshake and send a request's headers within
`header_timeout_s` (Go's ReadHeaderTimeout, 32 s in kube-apiserver), may stay open between
requests for `idle_timeout_s` (IdleTimeout, 90 s, also the idle timeout of Go's HTTP client:
kube-scheduler and kube-apiserver drop a kept-alive connection about when we would), must send
a request's whole body within `body_timeout_s` of its headers (kube-apiserver's 60 s request
timeout, which covers reading the body: a request in progress is never closed for being idle,
so without it a client trickling a body held its connection, and its share of the buffered
bodies, for ever), and at most `max_connections` are open at once.

What happens at the cap is decided here (`make_room`): the oldest idle connections give way
to a new one, as nginx reuses keep-alive connections when it runs out of them, so a flood of
idle connections cannot keep a real client out; a connection with a request in progress is
never closed for room, and when every connection is busy the new one is refused (closed at
once) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass(frozen=True)
class ConnectionLimits:
    #: TLS handshake and the first request's headers must arrive within this (seconds)
    header_timeout_s: float = 32.0
    #: a connection with no request in progress is closed after this long (seconds)
    idle_timeout_s: float = 90.0
    #: connections open at once (the process's file-descriptor limit lowers it)
    max_connections: int = 1024
    #: a request's body must arrive whole within this of its headers (seconds)
    body_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name, value, low, high in (("header_timeout_s", self.header_timeout_s, 0.001, 3600),
                                       ("idle_timeout_s", self.idle_timeout_s, 0.001, 86400),
                                       ("max_connections", self.max_connections, 1, 1_000_000),
                                       ("body_timeout_s", self.body_timeout_s, 0.001, 3600)):
            if not low <= value <= high:
                raise ValueError(f"{name}={value!r}: must be between {low} and {high}")


#: File descriptors kept back from the cap for everything else a server opens (its API
#: connections, files, the event loop's own).
RESERVED_FDS = 128


def effective_cap(configured: int, fd_limit: int | None) -> int:
    """The connection cap to enforce: the configured one, lowered to fit under the process's
    file-descriptor limit (`fd_limit`, RLIMIT_NOFILE's soft value; None: unlimited), at
    least 1."""
    if fd_limit is None or fd_limit <= 0:
        return configured
    return max(1, min(configured, fd_limit - RESERVED_FDS))


@dataclass(frozen=True)
class Room(Generic[K]):
    """What to do when a connection arrives: close these idle ones (oldest first), and
    whether the new one must be refused anyway (every open connection is busy)."""

    close: tuple[K, ...]
    refuse_new: bool


def make_room(open_count: int, idle_oldest_first: Sequence[K], cap: int) -> Room[K]:
    """Room for one more connection among `open_count` open ones, of which
    `idle_oldest_first` have no request in progress."""
    excess = open_count + 1 - cap
    if excess <= 0:
        return Room((), False)
    if len(idle_oldest_first) < excess:
        return Room((), True)  # closing some would not make room: keep them
    return Room(tuple(idle_oldest_first[:excess]), False)
