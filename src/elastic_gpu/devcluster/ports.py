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
import os
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


def _listening_inodes(port: int, tables: tuple[Path, ...]) -> set[str] | None:
    """The socket inodes listening on `port` (any address) per the kernel's TCP tables; None
    when no table could be read."""
    inodes: set[str] = set()
    read_any = False
    for table in tables:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for row in rows:
            fields = row.split()
            # local address (hex ip:port), remote, state (0A is LISTEN), ..., inode (field 9)
            if len(fields) > 9 and fields[3] == "0A" and \
                    int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes if read_any else None


def _session_sockets(session: int, proc: Path) -> set[str]:
    """The socket inodes open in the processes of `session` (a component and its children:
    each component is started in a session of its own)."""
    held: set[str] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[3]) != session:  # state ppid pgrp sid
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    held.add(target[len("socket:["):-1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return held


def listener_is_ours(session: int, port: int, proc: Path = Path("/proc")) -> bool | None:
    """Whether the socket listening on `port` belongs to a process of `session`; None when
    the machine cannot tell (no /proc). A component's readiness probe answered by some other
    process on the same port (one that took the port between our choosing it and the
    component's bind) must not count as the component being ready."""
    inodes = _listening_inodes(port, (proc / "net" / "tcp", proc / "net" / "tcp6"))
    if inodes is None:
        return None
    if not inodes:
        return False
    return bool(inodes & _session_sockets(session, proc))
