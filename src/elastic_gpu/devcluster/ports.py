"""Loopback port selection.

A port from the kernel's ephemeral range is free when we look, not necessarily when the
component binds it; holding all sockets of one cluster open until every port is chosen at
least keeps the ports of one cluster distinct. A late collision shows up as a component that
dies on start, which is reported with its log.
"""

from __future__ import annotations

import contextlib
import socket

from elastic_gpu.devcluster.errors import PortInUseError

HOST = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that nothing listens on right now."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_is_free(port: int) -> bool:
    """Whether a server could bind `port` now (like Go servers, ignoring TIME_WAIT leftovers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def is_listening(port: int) -> bool:
    """Whether something accepts connections on `port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((HOST, port)) == 0


def require_free(port: int, what: str) -> None:
    """Fail with a clear message if `port` is taken, before starting a component on it."""
    if not port_is_free(port):
        raise PortInUseError(port, what)
