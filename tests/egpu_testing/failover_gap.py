"""The pods that met an extender failover: created from the SIGKILL of the serving replica
until the new leader was first seen serving, and when each was bound (issue 39's goal: every
one within 5 s of the kill, p99). The first pod bound after a kill says little of these: a pod
created early in the gap is tried while no replica serves, and its retries are what
kube-scheduler's backoff delays.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_testing.failover import ExtenderPair, FirstSeenClock, KillResult, ObjectStream


@dataclass(frozen=True)
class GapPods:
    killed_at: float
    served_at: float
    #: pod name -> seconds from the kill until it was seen bound
    bound_s: Mapping[str, float]

    def line(self) -> str:
        values = sorted(self.bound_s.values())
        if not values:
            return "no pod created in the gap"
        return (f"{len(values)} pods created in the {self.served_at - self.killed_at:.2f} s "
                f"gap, bound from the kill: p50 {percentile(values, 0.5):.2f} s, "
                f"p99 {percentile(values, 0.99):.2f} s, max {values[-1]:.2f} s")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (of a few hundred samples: p99 is about the maximum)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def names_in_gap(created_at: Mapping[str, float], killed_at: float, served_at: float,
                 is_pod: Callable[[str], bool] = lambda _: True) -> list[str]:
    """The pods whose create returned from the kill until the new leader served."""
    return sorted(n for n, t in created_at.items()
                  if killed_at <= t <= served_at and is_pod(n))


def wait_gap_bound(clock: FirstSeenClock, stream: ObjectStream, result: KillResult,
                   is_pod: Callable[[str], bool] = lambda _: True,
                   timeout_s: float = 120.0) -> GapPods:
    """Until every pod created in `result`'s gap is bound; raises TimeoutError naming those
    that are not after `timeout_s`."""
    if result.served_at is None:
        raise ValueError("the round did not kill the extender")
    created = stream.created_between(result.killed_at, result.served_at)
    names = names_in_gap(created, result.killed_at, result.served_at, is_pod)
    deadline = time.monotonic() + timeout_s
    while True:
        seen = clock.seen(names)
        if len(seen) == len(names):
            return GapPods(result.killed_at, result.served_at,
                           {n: t - result.killed_at for n, t in seen.items()})
        if time.monotonic() > deadline:
            missing = sorted(set(names) - set(seen))
            raise TimeoutError(f"{len(missing)} pods created in the failover gap not bound "
                               f"after {timeout_s:.0f} s: {missing[:10]}")
        time.sleep(0.05)


#: kube-scheduler's log line for an attempt that ended in an error (the extender unreachable
#: or refusing): the pod then goes to its error backoff (klog: ... pod="<namespace>/<name>").
_ERROR_ATTEMPT = re.compile(r'"Error scheduling pod; retrying".*?\bpod="(?P<pod>[^"]+)"')


def failed_attempts(kube_scheduler_log: str, namespace: str) -> list[str]:
    """The names of `namespace`'s pods whose scheduling attempt failed with an error, one per
    attempt, in the order kube-scheduler logged them."""
    prefix = f"{namespace}/"
    return [m["pod"][len(prefix):] for m in _ERROR_ATTEMPT.finditer(kube_scheduler_log)
            if m["pod"].startswith(prefix)]


@contextlib.contextmanager
def running_pair(cluster: Any, namespace: str, work_dir: Path) -> Iterator[ExtenderPair]:
    """Two extender replicas under leader election on `cluster` (the GPUDevice CRD installed),
    stopped on exit: the failover tests' fixture."""
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(cluster.kube())
    replicas = ExtenderPair(cluster.kubeconfig, work_dir, namespace)
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()
