"""Pods and ElasticGPUs holding cards: the ledger derived from the API's annotations.

A bound pod holds what its assignment annotation names (`PodInfo.held`); an ElasticGPU
holds its cards under its ledger key. Also kept per pod: its CPU and memory (the policies'
view of a node) and its task shape (targetWorkload observed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.defrag import reservation as defrag_reservation
from elastic_gpu.core.placement import (
    Unschedulable,
    task_shape,
)
from elastic_gpu.core.policies import node_policy
from elastic_gpu.core.request import pod_host_requests
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.core.workload import TargetWorkload, TaskShape
from elastic_gpu.scheduler.slim import TERMINAL_PHASES
from elastic_gpu.scheduler.state.base import EGPU_KEY, StateBase
from elastic_gpu.scheduler.state.records import PodInfo

log = logging.getLogger(__name__)

#: UIDs of deleted pods remembered, so that a bind settling after the deletion was seen does
#: not bring the pod (and its cards) back; UIDs are never reused.
MAX_GONE = 10_000


class Holds(StateBase):
    """Pods from the API and what they (and ElasticGPUs) hold in the engine."""

    def _desired(self, uid: str) -> Assignment | None:
        if uid.startswith(EGPU_KEY):
            egpu = self._egpus.get(uid[len(EGPU_KEY):])
            if egpu is None or not egpu.node or not egpu.shares:
                return None
            return egpu_assignment(egpu)
        pod = self._pods.get(uid)
        if pod is None:
            return None
        held = pod.held(self._egpu_counted)
        if held is None and uid in self._reserved_until:
            return pod.reservation.assignment if pod.reservation is not None else None
        return held

    def _note_reservation(self, uid: str) -> None:
        """Whether the pod holds its defragmentation reservation now (`_reserved_until`): live
        (`core.defrag.reservation.live`: not bound, not stopped, not expired) and no bind of
        it in flight (a bind's reservation holds the cards it chose instead)."""
        pod = self._pods.get(uid)
        if pod is not None and pod.reservation is not None and uid not in self._inflight \
                and defrag_reservation.live(pod.reservation, node_name=pod.node_name,
                                            stopped=pod.stopped, now=self._wall()):
            self._reserved_until[uid] = pod.reservation.expires
        else:
            self._reserved_until.pop(uid, None)

    def _egpu_counted(self, name: str) -> bool:
        """Whether ElasticGPU `name` holds its cards in the ledger: it exists with a node and
        cards (`_desired`), or a reservation holds them while it is being created."""
        egpu = self._egpus.get(name)
        return (egpu is not None and bool(egpu.node) and bool(egpu.shares)) or \
            ledger_key(name) in self._inflight

    def _index_consumer(self, uid: str, old: PodInfo | None, new: PodInfo | None) -> None:
        before = old.elasticgpus() if old is not None else frozenset()
        after = new.elasticgpus() if new is not None else frozenset()
        for name in before - after:
            consumers = self._egpu_consumers.get(name)
            if consumers is not None:
                consumers.discard(uid)
                if not consumers:
                    del self._egpu_consumers[name]
        for name in after - before:
            self._egpu_consumers.setdefault(name, set()).add(uid)

    def _sync_consumers(self, name: str) -> None:
        """ElasticGPU `name` started or stopped being counted: its consumers give its cards
        back to it, or take them over (the card stays held either way)."""
        for uid in sorted(self._egpu_consumers.get(name, ())):
            self._sync(uid)

    def _set_hold(self, uid: str, assignment: Assignment | None) -> None:
        self._version += 1
        old = self._holds.pop(uid, None)
        if old is not None:
            self.engine.release(uid)
            self._node_pods.get(old.node, set()).discard(uid)
            self._mark_freed(old.node)
        self._conflicts.pop(uid, None)
        if assignment is None:
            return
        if assignment.node in self._dirty:
            # The node's inventory changed and is not in the engine yet (at start and after a
            # relist, every node): counting now would fail or count against the old cards, and
            # the flush counts it (it syncs every conflict, and a fresh engine every pod).
            self._conflicts[uid] = "its node's inventory is not counted yet"
            return
        try:
            self.engine.allocate(uid, assignment)
        except (Unschedulable, KeyError, ValueError) as err:
            # An annotation the inventory cannot hold (card gone, node unknown, over capacity):
            # remember it and count it as soon as the inventory allows.
            reason = getattr(err, "reason", str(err))
            self._conflicts[uid] = reason
            # Before every cache has listed, pods often arrive before their node's cards.
            log.log(logging.WARNING if self.ready else logging.DEBUG,
                    "pod uid %s: assignment on %s cannot be counted yet: %s",
                    uid, assignment.node, reason)
            return
        self._holds[uid] = assignment
        self._node_pods.setdefault(assignment.node, set()).add(uid)

    def _note_distrust(self, uid: str) -> None:
        """Remember (and log once) a live pod whose assignment the Binding did not write."""
        pod = self._pods.get(uid)
        reason = pod.distrusted if pod is not None and not pod.stopped else None
        if reason is None:
            self._distrusted.pop(uid, None)
        elif self._distrusted.get(uid) != reason:
            self._distrusted[uid] = reason
            log.warning("pod %s: not counting its %s annotation: %s", pod.key if pod else uid,
                        ann.ASSIGNMENT, reason)

    def _sync(self, uid: str) -> None:
        self._note_distrust(uid)
        if not uid.startswith(EGPU_KEY):
            self._note_reservation(uid)
        desired = self._desired(uid)
        if desired == self._holds.get(uid) and uid not in self._conflicts:
            return
        self._set_hold(uid, desired)

    # ---- pods from the API --------------------------------------------------------------------

    def observe_pod(self, pod: Mapping[str, Any] | PodInfo) -> None:
        """An ADDED/MODIFIED pod from the watch, or a pod a bind read back from the API."""
        info = pod if isinstance(pod, PodInfo) else PodInfo.from_manifest(pod)
        if not info.uid:
            return
        with self._lock:
            if info.uid in self._gone:
                return  # a late copy of a deleted pod (a bind's read-back): it stays gone
            old = self._pods.get(info.uid)
            if (old is not None and old.resource_version is not None
                    and info.resource_version is not None
                    and info.resource_version <= old.resource_version):
                # not newer than what we know: a pod read back after a bind overtook the
                # watch, or the version we already completed with what our Binding did
                return
            if old is not None and old.node_name and not info.node_name:
                # A pod is never unbound: a copy without a node is from before the Binding
                # we settled it with, whatever its resourceVersion says (the bind completed
                # the copy it read, and the pod may have changed since: kube-scheduler's
                # status update of an earlier failed attempt lands with a higher version).
                # Taking it would drop the pod's cards until the Binding's own event came,
                # and another pod could be given them meanwhile.
                return
            if info.assignment_error and (old is None or old.assignment_error is None):
                log.warning("pod %s: ignoring its %s annotation: %s", info.key, ann.ASSIGNMENT,
                            info.assignment_error)
            if info.reservation_error and (old is None or old.reservation_error is None):
                log.warning("pod %s: ignoring its %s annotation: %s", info.key,
                            ann.DEFRAG_RESERVATION, info.reservation_error)
            self._index_consumer(info.uid, old, info)
            self._pods[info.uid] = info
            if info.node_name or info.phase in TERMINAL_PHASES:
                self._drop_reservations(info.uid)  # bound or done: the truth is known
                self._waiting.pop(info.uid, None)
                self._claim_waiting.pop(info.uid, None)
            self._sync(info.uid)
            self._count_host(info.uid)
            self._count_shape(info.uid)

    def forget_pod(self, uid: str) -> None:
        """The pod is gone (DELETED, or it left the watch's selection by terminating)."""
        with self._lock:
            self._index_consumer(uid, self._pods.pop(uid, None), None)
            if uid:
                self._gone[uid] = None
                while len(self._gone) > MAX_GONE:
                    self._gone.popitem(last=False)
            self._waiting.pop(uid, None)
            self._claim_waiting.pop(uid, None)
            self._claim_wakes.pop(uid, None)
            self._drop_reservations(uid)
            self._sync(uid)
            self._count_host(uid)
            self._count_shape(uid)

    def _count_host(self, uid: str) -> None:
        """Keep the engine's view of the CPU and memory of bound pods per node current."""
        pod = self._pods.get(uid)
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

    def _add_host(self, node: str, cpu: int, mem: int, sign: int) -> None:
        self._version += 1
        old_cpu, old_mem = self._host_total.get(node, (0, 0))
        total = (old_cpu + sign * cpu, old_mem + sign * mem)
        if total == (0, 0):
            self._host_total.pop(node, None)
        else:
            self._host_total[node] = total
        self.engine.set_outside_usage(node, *total)

    def _count_shape(self, uid: str) -> None:
        """targetWorkload observed: keep the live pods' task shapes."""
        if self.config.target_workload != "observed":
            return
        pod = self._pods.get(uid)
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

    def _refresh_workload(self) -> None:
        """Rebuild the observed target workload once enough pods came or went."""
        if not self._shapes or (self.workload is not None
                                and self._shape_changes < self.config.workload_refresh_pods):
            return
        # the same choice of typical pods as `egpu simulate` (sim.replay.target_workload): the
        # live pods' mix against the nodes the engine has now
        popularity = node_policy(self.config.node_policy).popularity_for(
            self._shape_counts, self.engine.cluster_cpu_per_gpu)
        self.workload = TargetWorkload.from_counts(self._shape_counts, popularity)
        self._shape_changes = 0
        self.engine.set_workload(self.workload)
        self._version += 1

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A relist: exactly these pods exist."""
        infos = [PodInfo.from_manifest(p) for p in pods]
        with self._lock:
            fresh = {i.uid for i in infos if i.uid}
            for uid in set(self._pods) - fresh:
                self.forget_pod(uid)
            for uid in set(self._waiting) - fresh:
                del self._waiting[uid]
            for info in infos:
                # a relist is authoritative, even if its resourceVersion looks older
                self._pods.pop(info.uid, None)
                self.observe_pod(info)

    def pod(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)
