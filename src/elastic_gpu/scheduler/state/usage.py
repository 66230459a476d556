"""What the pods ask of their nodes besides cards: the CPU and memory of bound pods (the
policies' view of a node, pushed into the engine as outside usage) and, for targetWorkload
"observed", the task shape of every live pod. Kept by the ledger (`Ledger`) as pods come, go
and are reserved for.
"""

from __future__ import annotations

from collections import Counter

from elastic_gpu.core.placement import task_shape
from elastic_gpu.core.policies import node_policy
from elastic_gpu.core.request import pod_host_requests
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.core.workload import TargetWorkload, TaskShape
from elastic_gpu.scheduler.slim import TERMINAL_PHASES
from elastic_gpu.scheduler.state.handle import StateHandle
from elastic_gpu.scheduler.state.records import PodInfo


class PodUsage:
    """Bound pods' CPU and memory per node, and the live pods' task shapes."""

    def __init__(self, handle: StateHandle) -> None:
        self._h = handle
        #: CPU and memory of bound pods, for the policies' view of a node (not for fit:
        #: kube-scheduler filters on those before it asks us)
        self._host_of: dict[str, tuple[str, int, int]] = {}  # uid -> (node, CPU milli, MiB)
        #: the same for binds in flight, per reservation (the pod is not bound yet)
        self._host_reserved: dict[tuple[str, int], tuple[str, int, int]] = {}
        self._host_total: dict[str, tuple[int, int]] = {}  # node -> (CPU milli, MiB)
        #: targetWorkload "observed": the shape of every live pod, and how many pods came or
        #: went since the engine's workload was last rebuilt from them
        self._shapes: dict[str, TaskShape] = {}
        self._shape_counts: Counter[TaskShape] = Counter()
        self._shape_changes = 0

    def count_host(self, uid: str, pod: PodInfo | None) -> None:
        """Keep the engine's view of the CPU and memory of bound pods per node current."""
        now: tuple[str, int, int] | None = None
        if pod is not None and pod.node_name and pod.phase not in TERMINAL_PHASES:
            try:
                cpu, mem = pod_host_requests(pod.manifest)
            except ResourceError:
                cpu = mem = 0  # the API server validates quantities; nothing to count then
            now = (pod.node_name, cpu, mem)
        before = self._host_of.pop(uid, None)
        if now is not None:
            self._host_of[uid] = now
        if now == before:
            return
        if before is not None:
            self._add_host(*before, sign=-1)
        if now is not None:
            self._add_host(*now, sign=+1)

    def reserve_host(self, uid: str, token: int, node: str, cpu: int, mem: int) -> None:
        """A bind's reservation: the pod's CPU and memory count from now, like its cards,
        until the bind's outcome."""
        self._host_reserved[(uid, token)] = (node, cpu, mem)
        self._add_host(node, cpu, mem, sign=+1)

    def release_host(self, uid: str, token: int) -> None:
        held = self._host_reserved.pop((uid, token), None)
        if held is not None:
            self._add_host(*held, sign=-1)

    def hand_host_to_pod(self, uid: str, token: int) -> None:
        """A bind landed: its reservation's CPU and memory become the bound pod's count as
        they are (`count_host` then changes nothing when the pod's requests agree)."""
        held = self._host_reserved.pop((uid, token), None)
        if held is None:
            return
        if uid in self._host_of:
            self._add_host(*held, sign=-1)
        else:
            self._host_of[uid] = held

    def _add_host(self, node: str, cpu: int, mem: int, sign: int) -> None:
        self._h.bump()
        old_cpu, old_mem = self._host_total.get(node, (0, 0))
        total = (old_cpu + sign * cpu, old_mem + sign * mem)
        if total == (0, 0):
            self._host_total.pop(node, None)
        else:
            self._host_total[node] = total
        self._h.engine.set_outside_usage(node, *total)

    def push_host(self) -> None:
        """Every node's total into a fresh engine."""
        for name, (cpu, mem) in self._host_total.items():
            self._h.engine.set_outside_usage(name, cpu, mem)

    def host_total(self, node: str) -> tuple[int, int]:
        return self._host_total.get(node, (0, 0))

    def count_shape(self, uid: str, pod: PodInfo | None) -> None:
        """targetWorkload observed: keep the live pods' task shapes."""
        if self._h.config.target_workload != "observed":
            return
        shape: TaskShape | None = None
        if pod is not None and pod.phase not in TERMINAL_PHASES:
            try:
                shape = task_shape(pod.request())
            except ResourceError:
                shape = None  # a malformed request is no sample of the workload
        before = self._shapes.pop(uid, None)
        if before is not None:
            self._shape_counts[before] -= 1
            if self._shape_counts[before] <= 0:
                del self._shape_counts[before]
        if shape is not None:
            self._shapes[uid] = shape
            self._shape_counts[shape] += 1
        if (before is None) != (shape is None):
            self._shape_changes += 1

    def refresh_workload(self) -> None:
        """Rebuild the observed target workload once enough pods came or went."""
        h = self._h
        if not self._shapes or (h.workload is not None
                                and self._shape_changes < h.config.workload_refresh_pods):
            return
        # the same choice of typical pods as `egpu simulate` (sim.replay.target_workload): the
        # live pods' mix against the nodes the engine has now
        popularity = node_policy(h.config.node_policy).popularity_for(
            self._shape_counts, h.engine.cluster_cpu_per_gpu)
        h.workload = TargetWorkload.from_counts(self._shape_counts, popularity)
        self._shape_changes = 0
        h.engine.set_workload(h.workload)
        h.bump()

    def workload_size(self) -> tuple[int, int]:
        """(live pods counted for the observed workload, shapes of the workload in use)."""
        return len(self._shapes), len(self._h.engine.ctx.frag.workload.shapes)
