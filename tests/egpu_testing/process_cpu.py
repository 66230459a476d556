"""CPU by process kind, read from /proc: what the scheduling benches (bench/sched_floor.py,
bench/sched_throughput.py) print per pod bound. Both import it from here, not from each other."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The bench's own process (it counts the binds): shown beside the system's processes, never
#: summed with them.
HARNESS = "bench (counting)"


def system_total(by_kind: Mapping[str, float]) -> float:
    """What the measured system spent: every kind but the bench's own."""
    return sum(v for k, v in by_kind.items() if k != HARNESS)


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds (user + system) of this process and the live processes it started (the
    control plane, the extender, kube-scheduler), summed by what they are. Only its own: on a
    shared box other runs' kube-apiservers and extenders are of the same kinds, and a box-wide
    sum counted their work (and went negative when one of them exited between two reads)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        stats[int(entry)] = (stat, cmdline)
    parent = {pid: int(stat[stat.rindex(")") + 2:].split()[1]) for pid, (stat, _) in stats.items()}
    own = stats[os.getpid()][1] if os.getpid() in stats else None
    out: dict[str, float] = {}
    for pid, (stat, cmdline) in stats.items():
        if not _descends(pid, os.getpid(), parent):
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if comm in ("kube-apiserver", "etcd", "kube-scheduler", "kwok"):
            kind = comm
        elif "--serve-null" in cmdline:
            kind = "null extender"  # bench/sched_floor.py's do-nothing extender
        elif "elastic_gpu.scheduler.apiworker" in cmdline:
            kind = "egpu API worker"
        elif "egpu scheduler" in cmdline:
            kind = "egpu scheduler"
        elif pid == os.getpid() or cmdline == own:
            kind = HARNESS  # the bench, and a process it forked (bind_counter's watch)
        else:
            continue  # anything else on the box (other jobs) is not this measurement's
        out[kind] = out.get(kind, 0.0) + seconds
    return out


def _descends(pid: int, ancestor: int, parent: dict[int, int]) -> bool:
    """Whether `pid` is `ancestor` or started by it, at any depth."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        pid = parent.get(pid, 0)
        seen += 1
    return False
