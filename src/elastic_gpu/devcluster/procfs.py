"""What /proc says of our component processes: their `stat` fields, and whether the socket
listening on a port is one of theirs.

A component's readiness probe can be answered by another process that took its port first
(while ours dies on "address already in use"): `listener_is_ours` tells the two apart.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def stat_fields(pid_dir: Path) -> list[str] | None:
    """The fields of `<pid_dir>/stat` after the command name (field 3, the state, first); None
    when the process is gone or the file unreadable."""
    try:
        stat = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat[stat.rindex(")") + 2:].split()


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
        fields = stat_fields(entry)
        if fields is None or int(fields[3]) != session:  # state, ppid, pgrp, session
            continue
        try:
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    held.add(target[len("socket:["):-1])
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return held


def listener_is_ours(session: int, port: int, proc: Path = PROC) -> bool | None:
    """Whether the socket listening on `port` belongs to a process of `session`; None when
    the machine cannot tell (no TCP tables under `proc`)."""
    inodes = _listening_inodes(port, (proc / "net" / "tcp", proc / "net" / "tcp6"))
    if inodes is None:
        return None
    if not inodes:
        return False
    return bool(inodes & _session_sockets(session, proc))
