"""A flood of idle connections (issue 26, item 9), loopback only and bounded in count: TLS
connections that finish the handshake and never send a request, or bare TCP connections that
never start TLS; and whether the server closed them."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Callable


def idle_tls(port: int, context: ssl.SSLContext, count: int) -> list[ssl.SSLSocket]:
    """`count` TLS connections to 127.0.0.1:`port`, handshake done, no request sent. A
    connection the server closes during its handshake (at its cap) is left out."""
    out: list[ssl.SSLSocket] = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            out.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
        except (OSError, ssl.SSLError):
            raw.close()
    return out


def idle_tcp(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed this connection (EOF or reset), without blocking."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except (OSError, ssl.SSLError):
        return True


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


def close_all(sockets: list[socket.socket] | list[ssl.SSLSocket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()
