"""Loopback port selection.

A port is free when we look, not necessarily when the component binds it. Two things keep
the gap from biting on a busy machine (CI runs many clusters side by side):

- Ports are drawn at random from *below* the kernel's ephemeral range. The kernel hands out
  ephemeral ports on its own to every outgoing connection and every `bind(port 0)`; a port
  chosen there can be taken by some other process's client connection in the instant before
  our component binds it (CI saw kwok die on "address already in use" that way). Below the
  range only another explicit chooser could take it.
- The draw uses the operating system's randomness, never the `random` module's shared state:
  a test runner that seeds `random` identically in each worker would otherwise make parallel
  workers draw the same ports.

Holding all sockets of one call open until every port is chosen keeps the ports of one cluster
distinct. A late collision still shows up as a component that dies on start, reported with its
log.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

from elastic_gpu.devcluster.errors import PortInUseError

HOST = "127.0.0.1"
#: the lowest port drawn: above the well-known Kubernetes defaults (10248-10259) and the like
LOWEST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: attempts per port before giving up on the range below the ephemeral one
DRAWS = 200
_DRAW = random.SystemRandom()


def drawable_range(ephemeral_range: Path = EPHEMERAL_RANGE) -> range | None:
    """The ports below the kernel's ephemeral range and at or above `LOWEST`; None when the
    range is unknown or leaves too few (then the kernel chooses, as before)."""
    try:
        low = int(ephemeral_range.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LOWEST, low) if low - LOWEST >= 1000 else None


def free_ports(count: int, ephemeral_range: Path = EPHEMERAL_RANGE) -> list[int]:
    """`count` distinct loopback ports that nothing is bound to right now, outside the
    kernel's ephemeral range where the machine allows."""
    candidates = drawable_range(ephemeral_range)
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            ports.append(_bind_one(sock, candidates))
        return ports


def _bind_one(sock: socket.socket, candidates: range | None) -> int:
    if candidates is not None:
        for _ in range(DRAWS):
            port = _DRAW.choice(candidates)
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    sock.bind((HOST, 0))
    return int(sock.getsockname()[1])


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

