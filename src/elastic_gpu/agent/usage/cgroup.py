"""Which pod container a process runs in, from its cgroup (`/proc/<pid>/cgroup`), as DCGM
exporter finds it.

The kubelet puts every container in a cgroup under `kubepods`, whose path names the pod's UID
and ends in the container's runtime ID. The shapes in use (cgroup v1 lists one line per
hierarchy, v2 one `0::` line; the kubelet's systemd driver escapes the UID's dashes as
underscores):

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
    0::/kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope        (cri-o, Guaranteed QoS)
    0::/kubepods/besteffort/pod<uid>/<id>                             (cgroupfs driver)
    12:memory:/kubepods/burstable/pod<uid>/<id>                       (v1)
    0::/system.slice/docker-<id>.scope/kubepods/...                   (a node inside a container)

`parse_cgroup` is pure; `read_cgroup` and `container_pids` read `/proc` (a root given for
tests). A cri-o `crio-conmon-<id>` scope is the runtime's monitor, not the container.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                  r"(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})"
                        r"(?:\.scope)?$")


class CgroupRef(NamedTuple):
    """A pod (by UID, with dashes) and one of its containers (runtime ID, 64 hex digits)."""

    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod container in a `/proc/<pid>/cgroup` text; None for a process outside any
    (host processes, the pod sandbox's own cgroup, a runtime monitor)."""
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            if "kubepods" not in part or i + 1 >= len(parts):
                continue
            ref = _after_kubepods(parts[i + 1:])
            if ref is not None:
                return ref
    return None


def _after_kubepods(parts: list[str]) -> CgroupRef | None:
    for i, part in enumerate(parts):
        pod = _POD.search(part)
        if pod is None:
            continue
        if i + 1 >= len(parts):
            return None  # the pod's own cgroup, no container
        container = _CONTAINER.match(parts[i + 1])
        if container is None:
            return None  # e.g. crio-conmon-<id>.scope
        return CgroupRef(pod.group(1).replace("_", "-"), container.group(1))
    return None


def container_id(status_id: str) -> str:
    """A containerStatuses[].containerID (`containerd://<id>`) without its scheme."""
    return status_id.rpartition("://")[2]


def read_cgroup(pid: int, proc: Path = Path("/proc")) -> CgroupRef | None:
    """`pid`'s pod container, None when it is in none or is gone."""
    try:
        text = (proc / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    return parse_cgroup(text)


def container_pids(proc: Path = Path("/proc")) -> dict[str, list[int]]:
    """{container runtime ID: its processes' PIDs, ascending} over every process of `proc`
    (the fake backend's usage model on a real node: the container's real processes)."""
    out: dict[str, list[int]] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        ref = read_cgroup(int(entry.name), proc)
        if ref is not None:
            out.setdefault(ref.container_id, []).append(int(entry.name))
    for pids in out.values():
        pids.sort()
    return out
