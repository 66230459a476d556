"""CPU by process kind, read from /proc: what the scheduling benches (bench/sched_floor.py,
bench/sched_throughput.py) print per pod bound. Both import it from here, not from each other."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds (user + system) of the live processes, summed by what they are."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
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
        elif int(entry) == os.getpid():
            kind = "bench (polling)"
        else:
            continue  # anything else on the box (other jobs) is not this measurement's
        out[kind] = out.get(kind, 0.0) + seconds
    return out
