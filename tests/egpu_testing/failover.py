"""Two extender replicas behind a stand-in Service, and a steady stream of GPU pods: the
failover test (tests/integration/scheduler/test_sched_failover.py) and its benchmark
(bench/sched_failover.py).

The replicas are real `egpu scheduler` processes with `leaderElection.enabled` on a Lease of
the test's namespace; kube-scheduler reaches them through `devcluster.readyproxy`, which
stands in for the chart's Service and kube-proxy (the dev control plane runs no kube-proxy):
each new connection goes to the replica whose /readyz answers 200, the leader.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from egpu_testing.scenario import Progress, create_pods
from egpu_testing.workbench import ExtenderProcess
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.readyproxy import Backend, ReadyForwarder


class ExtenderPair:
    """Replicas "a" and "b" of one extender (one Lease, one schedulerName) and the
    forwarder in front of them (`url`: what kube-scheduler's extender stanza names)."""

    def __init__(self, kubeconfig: Path, work_dir: Path, namespace: str,
                 config: Mapping[str, Any] | None = None) -> None:
        ports = free_ports(2)
        self.lease = f"egpu-scheduler-{uuid.uuid4().hex[:8]}"
        self.namespace = namespace
        settings = {"leaderElection": {"enabled": True, "leaseNamespace": namespace,
                                       "leaseName": self.lease}, **dict(config or {})}
        first = ExtenderProcess(kubeconfig, ports[0], work_dir / "extender-a.log", settings,
                                args=["--identity", "a"])
        second = ExtenderProcess(kubeconfig, ports[1], work_dir / "extender-b.log", settings,
                                 scheduler_name=first.scheduler_name, args=["--identity", "b"])
        self.replicas = (first, second)
        self.scheduler_name = first.scheduler_name
        self.forwarder = ReadyForwarder([Backend.parse(f"127.0.0.1:{p}") for p in ports])

    @property
    def url(self) -> str:
        return self.forwarder.url

    def start(self) -> None:
        """"a" leads (it starts first, alone), "b" stands by with its caches synced."""
        self.forwarder.start_in_thread()
        self.replicas[0].start()
        self.replicas[1].start(standby=True)

    def leader(self) -> ExtenderProcess | None:
        serving = [r for r in self.replicas if r.readyz()[0] == 200]
        assert len(serving) <= 1, "two replicas serve at once"
        return serving[0] if serving else None

    def wait_leader(self, timeout_s: float = 60.0, other_than: ExtenderProcess | None = None
                    ) -> ExtenderProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader is not other_than:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"no replica leads after {timeout_s:.0f} s:\n" + self.log_tails())

    def lease_acquired(self, client: Any) -> tuple[str, float]:
        """(holder, acquireTime as wall-clock seconds) of the replicas' Lease."""
        from lightkube.resources.coordination_v1 import Lease

        lease = client.get(Lease, name=self.lease, namespace=self.namespace)
        spec = lease.spec
        return str(spec.holderIdentity), spec.acquireTime.timestamp()

    def standby_of(self, leader: ExtenderProcess) -> ExtenderProcess:
        return self.replicas[1] if leader is self.replicas[0] else self.replicas[0]

    def log_tails(self) -> str:
        return "\n".join(f"---- {r.log_path.name}\n{r.log_tail()}" for r in self.replicas)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()
        self.forwarder.stop()


def stream_pods(client: Any, pods: Sequence[Mapping[str, Any]], per_second: float,
                progress: Progress, stop: threading.Event | None = None) -> threading.Thread:
    """Create `pods` at a steady `per_second` in a background thread (returned, started);
    `stop` ends the stream early."""
    def run() -> None:
        started = time.monotonic()
        for i, pod in enumerate(pods):
            if stop is not None and stop.is_set():
                return
            delay = started + i / per_second - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            create_pods(client, [pod], parallelism=1, progress=progress)

    thread = threading.Thread(target=run, name="pod-stream", daemon=True)
    thread.start()
    return thread


class BindClock:
    """When each pod of a namespace was first seen bound (wall-clock seconds, comparable with a
    Lease's acquireTime written on the same machine), from a watch."""

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.bound_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bind-clock", daemon=True)

    def _run(self) -> None:
        from lightkube.resources.core_v1 import Pod

        while not self._stop.is_set():
            try:
                for _, pod in self.client.watch(Pod, namespace=self.namespace):
                    if self._stop.is_set():
                        return
                    if pod.spec is not None and pod.spec.nodeName and pod.metadata is not None:
                        with self._lock:
                            self.bound_at.setdefault(str(pod.metadata.name), time.time())
            except Exception:  # the watch ended or broke: watch again
                time.sleep(0.1)

    def first_bound_after(self, moment: float) -> float | None:
        with self._lock:
            later = [t for t in self.bound_at.values() if t > moment]
        return min(later) if later else None

    def bound_between(self, start: float, end: float) -> int:
        with self._lock:
            return sum(1 for t in self.bound_at.values() if start < t < end)

    @contextmanager
    def running(self) -> Iterator[BindClock]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
