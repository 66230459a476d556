"""What the extender knows: inventory, every pod's hold on cards, and binds in flight.

The API server is the source of truth. A bound pod *holds* the cards its assignment
annotation names (written atomically with its Binding, see `server.Extender.bind`); the engine's
allocations are derived from those annotations plus the reservations of binds whose outcome
is not known yet, so a restarted scheduler that lists pods arrives at the same allocations.

Concurrency: every method runs to completion without awaiting and takes `_lock`, so engine
mutations are serialized and a filter or bind always sees every earlier reservation. Holds are
keyed by pod UID: a pod deleted and re-created under the same name is a different pod.

ElasticGPUs (issue #15, docs/claims.md): every ElasticGPU with a node and cards holds them in
the engine under `core.claims.inventory.ledger_key(name)`, whatever its phase, until it is deleted; the
holds live in the same `_holds` as pods' (keyed by ledger key instead of pod UID), so relists,
inventory changes and conflicts treat both alike. A pod consuming a claim carries an
assignment whose claim-backed containers are marked (`Assignment.claims`): only its other
containers are held under its UID (`Assignment.unclaimed`). Provisioning (`reserve_elasticgpu`)
reserves an ElasticGPU's cards under its ledger key before it is created, like a bind.

Reservations: `reserve` allocates before the Binding is sent, under its own engine key, so a
pod can have several (a retry while an earlier attempt's outcome is unknown). `settle` ends
one: bound (the annotation holds the cards from then on), failed (the API refused: freed), or
unknown (a timeout: kept until `reservationTTLSeconds`, longer than any request can take to
land). Seeing the pod bound in the API ends all of its reservations: the truth is known.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from elastic_gpu.core import annotations as ann
from elastic_gpu.core import podlife
from elastic_gpu.core.assignment import Assignment, AssignmentError, distrust
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims import pods as claim_pods
from elastic_gpu.core.claims import provisioning as claim_provisioning
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.decisions import Decision, Pending
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.claims.model import Claim, GPUClass
from elastic_gpu.core.claims.pods import (
    ClaimAnnotationError,
    PodClaims,
    off_node_reason,
    pod_claims,
    resolve_pod_claims,
)
from elastic_gpu.core.fit import FitFailure, FitKind
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.nodeaffinity import Taint
from elastic_gpu.core.placement import (
    Engine,
    FilterResult,
    PolicyConfig,
    ScoredNodes,
    Unschedulable,
    task_shape,
)
from elastic_gpu.core.policies import node_policy
from elastic_gpu.core.request import PodRequest, pod_host_requests, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.core.wakeup import Waiter, Wake, asked_nodes, plan_wakeups
from elastic_gpu.core.workload import TargetWorkload, TaskShape
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.slim import TERMINAL_PHASES

log = logging.getLogger(__name__)

#: Failed nodes explained one by one per filter call; the rest share `SUMMARY_FAILURE`.
DETAIL_LIMIT = 16
SUMMARY_FAILURE = FitFailure(FitKind.UNDETAILED)
UNKNOWN_NODE_FAILURE = FitFailure(FitKind.UNKNOWN_NODE)
#: Pods remembered as waiting for GPU capacity; past this the longest-waiting are forgotten
#: (kube-scheduler's five-minute flush still retries them).
MAX_WAITING = 10_000
#: Prefix of ElasticGPU ledger keys (`core.claims.inventory.ledger_key`); never a pod UID.
EGPU_KEY = ledger_key("")
#: The feeds of the Elastic GPU API (their CRDs missing = none exist, `apiworker`).
CLAIM_SOURCES = frozenset({"elasticgpus", "elasticgpuclaims", "elasticgpuclasses"})
#: Pods remembered as waiting for a claim to be bound.
MAX_CLAIM_WAITING = 10_000
#: UIDs of deleted pods remembered, so that a bind settling after the deletion was seen does
#: not bring the pod (and its cards) back; UIDs are never reused.
MAX_GONE = 10_000


@dataclass(frozen=True)
class NodeInfo:
    """What the extender needs from a Kubernetes Node."""

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    #: GPU resources in its capacity (name -> count); None: not known (node-level vendor
    #: check off). Cards' own `offers` (GPUDevice spec.resources) are checked within these.
    offers: Mapping[str, int] | None = None
    #: for the bind's placement check (`core.nodeaffinity`)
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class PodInfo:
    """What the extender needs from a Kubernetes Pod (one version of it)."""

    uid: str
    namespace: str
    name: str
    node_name: str
    phase: str
    resource_version: int | None
    priority: int
    assignment: Assignment | None
    #: Why the assignment annotation could not be read, if it could not.
    assignment_error: str | None
    manifest: Mapping[str, Any]
    #: no container of it runs or will run again (`core.podlife.stopped`): a terminal phase,
    #: or deleted with its containers terminated, whatever finalizer keeps the object
    stopped: bool = False
    #: `elasticgpu.io/assigned-node`, which the Binding writes with the assignment
    assigned_node: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def distrusted(self) -> str | None:
        """Why the pod's assignment is not the scheduler's (`core.assignment.distrust`: not
        bound, or bound elsewhere than it names), None when it is or there is none."""
        if self.assignment is None:
            return None
        return distrust(self.node_name, self.assigned_node, self.assignment)

    @property
    def holds(self) -> Assignment | None:
        """The cards this version of the pod holds according to the API, every ElasticGPU it
        names counted under its own key."""
        return self.held(lambda _egpu: True)

    def held(self, counted: Callable[[str], bool]) -> Assignment | None:
        """The cards this version of the pod holds itself while it has not stopped: its
        assignment less the claim-backed containers whose ElasticGPU the ledger counts
        (`counted`); one whose ElasticGPU is gone stays the pod's until the pod stops. Only an
        assignment the scheduler's Binding wrote holds anything (docs/architecture.md, "Who
        writes the ledger")."""
        if self.stopped or self.assignment is None:
            return None
        if self.distrusted is not None:
            return None  # not bound, or bound elsewhere than it names: not the Binding's
        return self.assignment.unclaimed(counted)

    def elasticgpus(self) -> frozenset[str]:
        """The ElasticGPUs whose cards its claim-backed containers use (none for an assignment
        the Binding did not write)."""
        if self.assignment is None or self.distrusted is not None:
            return frozenset()
        return frozenset(self.assignment.claims.values())

    def request(self) -> PodRequest:
        return pod_request_from_manifest(self.manifest)

    @staticmethod
    def from_manifest(pod: Mapping[str, Any]) -> PodInfo:
        meta: Mapping[str, Any] = pod.get("metadata") or {}
        spec: Mapping[str, Any] = pod.get("spec") or {}
        status: Mapping[str, Any] = pod.get("status") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        assignment: Assignment | None = None
        error: str | None = None
        text = annotations.get(ann.ASSIGNMENT)
        if text:
            try:
                assignment = Assignment.from_json(text)
            except AssignmentError as err:
                error = str(err)
        rv_text = meta.get("resourceVersion")
        try:
            rv = int(rv_text) if rv_text is not None else None
        except (TypeError, ValueError):
            rv = None
        priority = spec.get("priority")
        return PodInfo(
            uid=str(meta.get("uid") or ""),
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            node_name=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or ""),
            resource_version=rv,
            priority=priority if isinstance(priority, int) else 0,
            assignment=assignment,
            assignment_error=error,
            manifest=pod,
            stopped=podlife.stopped(pod),
            assigned_node=annotations.get(ann.ASSIGNED_NODE),
        )


@dataclass
class _Reservation:
    assignment: Assignment
    #: monotonic time after which it is dropped; infinite while its bind is still running
    deadline: float = float("inf")


class StateNotReady(RuntimeError):
    """Caches not synced yet: any answer would be a guess."""


class SchedulerState:
    def __init__(self, config: SchedulerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or SchedulerConfig()
        self._clock = clock
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeInfo] = {}
        self._devices: dict[str, tuple[str, Card]] = {}  # device object name -> (node, card)
        self._node_devices: dict[str, set[str]] = {}
        self._dirty: set[str] = set()
        self._pods: dict[str, PodInfo] = {}  # uid -> latest version seen
        self._gone: OrderedDict[str, None] = OrderedDict()  # uids seen deleted, newest last
        self._inflight: dict[str, dict[int, _Reservation]] = {}  # uid -> token -> reservation
        self._tokens = 0
        self._holds: dict[str, Assignment] = {}  # uid -> what the engine has allocated
        self._node_pods: dict[str, set[str]] = {}  # node -> uids holding cards there
        self._conflicts: dict[str, str] = {}  # uid -> why its annotation could not be counted
        #: uid -> why its assignment is not the scheduler's (not counted; logged once)
        self._distrusted: dict[str, str] = {}
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
        self.workload: TargetWorkload | None = None  # None: the built-in default
        self.engine = self._new_engine(())
        self._known: frozenset[str] = frozenset()
        #: bumped by every change of the engine's allocations or inventory
        self._version = 0
        self._last_scores: tuple[str, PodRequest, int, ScoredNodes] | None = None
        self._synced: set[str] = set()
        #: Waking pending pods (`core.wakeup`): the pods the filter turned away for GPU reasons,
        #: the nodes whose capacity freed since (node -> epoch of the latest freeing), and the
        #: counter that orders the two. Freeings are recorded only while some pod waits.
        self._waiting: dict[str, Waiter] = {}
        self._freed: dict[str, int] = {}
        self._epoch = 0
        self.wakeup_counts: Counter[str] = Counter()
        #: The Elastic GPU API as the watches show it (core types), and ElasticGPU object
        #: UIDs seen deleted (a create's answer arriving after the deletion stays gone).
        self._egpus: dict[str, claim_model.ElasticGPU] = {}
        self._egpu_uids: dict[str, str] = {}
        self._egpus_gone: OrderedDict[str, None] = OrderedDict()
        self._claims: dict[tuple[str, str], Claim] = {}
        self._classes: dict[str, GPUClass] = {}
        #: ElasticGPU name -> uids of the pods whose assignment uses its cards: they hold
        #: those cards themselves while it is not counted (`_egpu_counted`)
        self._egpu_consumers: dict[str, set[str]] = {}
        #: pods the filter turned away because a claim they name is not bound (uid -> (pod
        #: namespace, name, the claims it waits for)), and those to wake now that one is
        self._claim_waiting: dict[str, tuple[str, str, frozenset[str]]] = {}
        self._claim_wakes: dict[str, Wake] = {}
        self.required_sources: frozenset[str] = frozenset({"nodes", "pods", "gpudevices"}) \
            | CLAIM_SOURCES

    # ---- readiness --------------------------------------------------------------------------

    def mark_synced(self, source: str) -> None:
        with self._lock:
            self._synced.add(source)
            self._flush()

    @property
    def ready(self) -> bool:
        return self.required_sources <= self._synced

    def not_ready_reason(self) -> str:
        missing = ", ".join(sorted(self.required_sources - self._synced))
        return f"the Elastic GPU scheduler has not synced its caches yet ({missing}); retry shortly"

    def require_ready(self) -> None:
        if not self.ready:
            raise StateNotReady(self.not_ready_reason())

    # ---- inventory --------------------------------------------------------------------------

    def _new_engine(self, nodes: Iterable[Node]) -> Engine:
        policy = PolicyConfig(node_policy=self.config.node_policy,
                              card_policy=self.config.card_policy,
                              check_host_resources=False)
        return Engine(nodes, config=policy, seed=self.config.seed, workload=self.workload)

    def upsert_node(self, info: NodeInfo) -> None:
        with self._lock:
            if self._nodes.get(info.name) != info:
                self._nodes[info.name] = info
                self._dirty.add(info.name)

    def remove_node(self, name: str) -> None:
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._dirty.add(name)

    def replace_nodes(self, infos: Iterable[NodeInfo]) -> None:
        """A relist: exactly these nodes exist."""
        with self._lock:
            fresh = {i.name: i for i in infos}
            for name in set(self._nodes) - set(fresh):
                self.remove_node(name)
            for info in fresh.values():
                self.upsert_node(info)

    def upsert_device(self, object_name: str, node: str, card: Card) -> None:
        with self._lock:
            old = self._devices.get(object_name)
            if old == (node, card):
                return
            if old is not None and old[0] != node:
                self._node_devices.get(old[0], set()).discard(object_name)
                self._dirty.add(old[0])
            self._devices[object_name] = (node, card)
            self._node_devices.setdefault(node, set()).add(object_name)
            self._dirty.add(node)

    def remove_device(self, object_name: str) -> None:
        with self._lock:
            old = self._devices.pop(object_name, None)
            if old is not None:
                self._node_devices.get(old[0], set()).discard(object_name)
                self._dirty.add(old[0])

    def replace_devices(self, devices: Iterable[tuple[str, str, Card]]) -> None:
        with self._lock:
            fresh = {name: (node, card) for name, node, card in devices}
            for name in set(self._devices) - set(fresh):
                self.remove_device(name)
            for name, (node, card) in fresh.items():
                self.upsert_device(name, node, card)

    def _model_node(self, name: str) -> Node | None:
        info = self._nodes.get(name)
        if info is None:
            return None
        cards: dict[int, Card] = {}
        for obj in sorted(self._node_devices.get(name, ())):
            card = self._devices[obj][1]
            if card.index in cards:
                log.warning("node %s: two GPUDevice objects claim card %d; using %s",
                            name, card.index, obj)
            cards[card.index] = card
        return Node(name, info.cpu_milli, info.memory_mib,
                    tuple(cards[i] for i in sorted(cards)), dict(info.labels), info.offers)

    def node(self, name: str) -> NodeInfo | None:
        """The node as its watch last showed it (labels, taints), or None if unknown."""
        return self._nodes.get(name)

    def known_nodes(self) -> frozenset[str]:
        """Nodes the engine knows (with their inventory), as of the last flush."""
        return self._known

    def _flush(self) -> None:
        """Push changed nodes into the engine (batched: a relist rebuilds once)."""
        if not self._dirty:
            return
        try:
            self._apply_dirty()
        finally:
            self._known = frozenset(self.engine.nodes())

    def _apply_dirty(self) -> None:
        self._version += 1
        dirty, self._dirty = self._dirty, set()
        for name in dirty:  # a node added, or its cards changed: it may have grown
            self._mark_freed(name)
        known = set(self.engine.nodes())
        if len(dirty) > 64 and len(dirty) * 4 > len(known):
            # Many nodes changed (startup, relist): a fresh engine from all nodes, then every
            # hold again, is cheaper than thousands of single updates.
            nodes = [n for n in (self._model_node(name) for name in sorted(self._nodes)) if n]
            self.engine = self._new_engine(nodes)
            for name, (cpu, mem) in self._host_total.items():
                self.engine.set_outside_usage(name, cpu, mem)
            self._holds.clear()
            self._node_pods.clear()
            for name in self._egpus:  # ElasticGPUs first: a bound claim's cards are its
                self._sync(ledger_key(name))
            for uid in self._pods:
                self._sync(uid)
            for uid, reservations in self._inflight.items():
                for token, reservation in reservations.items():
                    self._allocate_reservation(uid, token, reservation.assignment)
            return
        for name in sorted(dirty):
            node = self._model_node(name)
            if node is None:
                if name in known:
                    self.engine.remove_node(name)
                continue
            self.engine.upsert_node(node)
            # Re-count the holds on that node: a node that came back lost its allocations.
            for uid in list(self._node_pods.get(name, ())):
                assignment = self._holds.get(uid)
                if assignment is not None and self.engine.allocation(uid) != assignment:
                    self._holds.pop(uid)
                    self._sync(uid)
        # ElasticGPUs first: where one and a pod claim the same card, the bound claim wins
        for uid in sorted(self._conflicts, key=lambda key: not key.startswith(EGPU_KEY)):
            self._sync(uid)

    # ---- holds ------------------------------------------------------------------------------

    def _desired(self, uid: str) -> Assignment | None:
        if uid.startswith(EGPU_KEY):
            egpu = self._egpus.get(uid[len(EGPU_KEY):])
            if egpu is None or not egpu.node or not egpu.shares:
                return None
            return egpu_assignment(egpu)
        pod = self._pods.get(uid)
        return pod.held(self._egpu_counted) if pod is not None else None

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
            if info.assignment_error and (old is None or old.assignment_error is None):
                log.warning("pod %s: ignoring its %s annotation: %s", info.key, ann.ASSIGNMENT,
                            info.assignment_error)
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

    # ---- the Elastic GPU API: ElasticGPUs, claims, classes ------------------------------------

    def _claim_keys_changed(self, keys: Iterable[str]) -> None:
        """Claims (namespace/name) whose binding may have changed: wake the pods waiting for
        them that can now be placed (`wakeups`)."""
        changed = set(keys)
        if not changed or not self._claim_waiting:
            return
        for uid, (namespace, name, waits) in list(self._claim_waiting.items()):
            if waits & changed:
                self._recheck_claim_waiter(uid, namespace, name)

    def _recheck_claim_waiter(self, uid: str, namespace: str, name: str) -> None:
        pod = self._pods.get(uid)
        if pod is None:
            self._claim_waiting.pop(uid, None)
            return
        try:
            named = pod_claims(pod.manifest)
        except ClaimAnnotationError:
            return
        view = self._claim_view(namespace, named)
        if view.blocked is None:
            del self._claim_waiting[uid]
            where = f" on node {view.node}" if view.node else ""
            self._claim_wakes[uid] = Wake(
                uid, namespace, name, view.node or "",
                f"the ElasticGPUClaims this pod names can now be placed{where}")

    def upsert_elasticgpu(self, egpu: claim_model.ElasticGPU, uid: str = "") -> None:
        """An ElasticGPU from the watch (or the API's answer to our create): it holds its cards
        from now on; any reservation made to create it ends (the truth is known)."""
        with self._lock:
            if uid and uid in self._egpus_gone:
                return  # a late copy of a deleted one
            key = ledger_key(egpu.name)
            if self._egpus.get(egpu.name) == egpu and key not in self._inflight:
                return
            self._egpus[egpu.name] = egpu
            if uid:
                self._egpu_uids[egpu.name] = uid
            self._sync_consumers(egpu.name)  # they give its cards back first
            self._drop_reservations(key)
            self._sync(key)
            if egpu.claim_ref is not None:
                self._claim_keys_changed([f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"])

    def remove_elasticgpu(self, name: str) -> None:
        with self._lock:
            egpu = self._egpus.pop(name, None)
            uid = self._egpu_uids.pop(name, None)
            if uid:
                self._egpus_gone[uid] = None
                while len(self._egpus_gone) > MAX_GONE:
                    self._egpus_gone.popitem(last=False)
            self._sync(ledger_key(name))
            self._sync_consumers(name)  # a running pod using its cards holds them now
            if egpu is not None and egpu.claim_ref is not None:
                self._claim_keys_changed([f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"])

    def replace_elasticgpus(self, egpus: Iterable[tuple[claim_model.ElasticGPU, str]]) -> None:
        """A relist: exactly these ElasticGPUs (with their object UIDs) exist."""
        with self._lock:
            fresh = {egpu.name: (egpu, uid) for egpu, uid in egpus}
            for name in set(self._egpus) - set(fresh):
                self.remove_elasticgpu(name)
            for egpu, uid in fresh.values():
                self.upsert_elasticgpu(egpu, uid)

    def upsert_claim(self, claim: Claim) -> None:
        with self._lock:
            if self._claims.get((claim.namespace, claim.name)) == claim:
                return
            self._claims[(claim.namespace, claim.name)] = claim
            self._claim_keys_changed([claim.key])

    def remove_claim(self, namespace: str, name: str) -> None:
        with self._lock:
            if self._claims.pop((namespace, name), None) is not None:
                self._claim_keys_changed([f"{namespace}/{name}"])

    def replace_claims(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            fresh = {(c.namespace, c.name): c for c in claims}
            for namespace, name in set(self._claims) - set(fresh):
                self.remove_claim(namespace, name)
            for claim in fresh.values():
                self.upsert_claim(claim)

    def upsert_class(self, cls: GPUClass) -> None:
        with self._lock:
            if self._classes.get(cls.name) != cls:
                self._classes[cls.name] = cls
                self._claim_keys_changed(self._claims_of_class(cls.name))

    def remove_class(self, name: str) -> None:
        with self._lock:
            if self._classes.pop(name, None) is not None:
                self._claim_keys_changed(self._claims_of_class(name))

    def replace_classes(self, classes: Iterable[GPUClass]) -> None:
        with self._lock:
            fresh = {c.name: c for c in classes}
            for name in set(self._classes) - set(fresh):
                self.remove_class(name)
            for cls in fresh.values():
                self.upsert_class(cls)

    def _claims_of_class(self, name: str) -> list[str]:
        return [c.key for c in self._claims.values() if c.class_name == name]

    def claim(self, namespace: str, name: str) -> Claim | None:
        return self._claims.get((namespace, name))

    def elasticgpu(self, name: str) -> claim_model.ElasticGPU | None:
        return self._egpus.get(name)

    def elasticgpus(self) -> dict[str, claim_model.ElasticGPU]:
        with self._lock:
            return dict(self._egpus)

    def classes(self) -> dict[str, GPUClass]:
        with self._lock:
            return dict(self._classes)

    def _claim_view(self, namespace: str, named: Mapping[str, str]) -> PodClaims:
        return resolve_pod_claims(namespace, named, self._claims, self._classes, self._egpus)

    def claim_view(self, namespace: str, named: Mapping[str, str]) -> PodClaims:
        """How a pod of `namespace` naming these claims (container -> claim) is placed now."""
        with self._lock:
            return self._claim_view(namespace, named)

    def filter_claims(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                      named: Mapping[str, str]) -> tuple[FilterResult, dict[str, str]]:
        """`filter` for a pod whose containers name claims: (the engine's result for its other
        containers, node -> why a claim rules the node out). A bound claim's containers need
        nothing more, on its ElasticGPU's node only; an unbound WaitForFirstConsumer claim's
        container is placed like any (it carries the claim's request); any other unbound claim
        rules out every node, and the pod waits for it (`wakeups`)."""
        with self._lock:
            self._prepare()
            view = self._claim_view(pod.namespace, named)
            if view.blocked is not None:
                self._waiting.pop(uid, None)
                if node_names:
                    self._claim_waiting.pop(uid, None)
                    self._claim_waiting[uid] = (pod.namespace, pod.name, view.waits_for)
                    while len(self._claim_waiting) > MAX_CLAIM_WAITING:
                        del self._claim_waiting[next(iter(self._claim_waiting))]
                    self.wakeup_counts["claim_turned_away"] += 1
                return FilterResult([], {}), dict.fromkeys(node_names, view.blocked)
            self._claim_waiting.pop(uid, None)
            rest = without_containers(pod, view.bound)
            node = view.node
            if node is None:
                return self.filter(rest, uid, node_names), {}
            container, egpu = next(iter(sorted(view.bound.items())))
            off = off_node_reason(container, f"{pod.namespace}/{named[container]}", egpu)
            reasons = {n: off for n in node_names if n != node}
            if node not in node_names:
                self._waiting.pop(uid, None)
                return FilterResult([], {}), reasons
            if not rest.wants_gpu:
                self._waiting.pop(uid, None)
                return FilterResult([node], {}), reasons
            return self.filter(rest, uid, [node]), reasons

    def reserve_claims(self, pod: PodRequest, uid: str, node: str, view: PodClaims
                       ) -> tuple[int, Assignment, list[tuple[claim_model.ElasticGPU, int]]]:
        """`reserve` for a pod naming claims: its bound claims' containers get their
        ElasticGPUs' cards (held already, under the ElasticGPUs' keys); cards are chosen on
        `node` for the others, and those chosen for a WaitForFirstConsumer claim's container are
        reserved for the claim's ElasticGPU (`first_consumer_elasticgpu`, to be created before
        the Binding). Returns the pod's token, its whole assignment (with the `claims` mark)
        and each ElasticGPU to create with its reservation token (`settle_elasticgpu`)."""
        with self._lock:
            self._prepare()
            rest = without_containers(pod, view.bound)
            placed = self.engine.assign(rest, node) if rest.wants_gpu else Assignment(node, {})
            made = []
            for container, claim in sorted(view.first_consumer.items()):
                cls = self._classes.get(claim.class_name or "")
                if cls is None:
                    raise Unschedulable(FitFailure(FitKind.UNDETAILED), node)
                made.append(claim_pods.first_consumer_elasticgpu(
                    claim, cls, node, tuple(placed.containers.get(container, ()))))
            own = Assignment(node, {c: s for c, s in placed.containers.items()
                                    if c not in view.first_consumer})
            token = self._reserve_assignment(pod, uid, node, own)
            tokens = []
            try:
                for egpu in made:
                    tokens.append((egpu, self._reserve_egpu(egpu)))
            except Unschedulable:
                for egpu, etoken in tokens:
                    self._drop_reservations(ledger_key(egpu.name), etoken)
                self._drop_reservations(uid, token)
                raise
            containers = dict(placed.containers)
            containers.update({c: e.shares for c, e in view.bound.items()})
            return token, Assignment(node, containers, view.marks()), tokens

    def _reserve_egpu(self, egpu: claim_model.ElasticGPU) -> int:
        key = ledger_key(egpu.name)
        assignment = egpu_assignment(egpu)
        self._tokens += 1
        token = self._tokens
        self.engine.allocate(self._reservation_key(key, token), assignment)
        self._version += 1
        self._inflight.setdefault(key, {})[token] = _Reservation(assignment)
        return token

    def provision(self, claim: Claim) -> tuple[Decision | claim_model.ElasticGPU, int | None]:
        """/provision's decision for a claim, from the caches (`core.claims.binding.decide`); on
        Provision, the ElasticGPU placed by the engine (`core.claims.provisioning.provision`) with its cards
        reserved under its ledger key (the token, for `settle_elasticgpu`)."""
        with self._lock:
            self._prepare()
            decision = decide(claim, self._classes, self._egpus)
            if not isinstance(decision, claim_decisions.Provision):
                return decision, None
            cls = self._classes[claim.class_name or ""]
            made = claim_provisioning.provision(decision, claim, cls, self.engine)
            if isinstance(made, Pending):
                return made, None
            return made, self._reserve_egpu(made)

    def settle_elasticgpu(self, name: str, token: int, outcome: str,
                          created: claim_model.ElasticGPU | None = None, uid: str = "") -> None:
        """End an ElasticGPU's reservation: `created` (pass what the API holds: it holds the
        cards from now on, as if the watch had shown it), `failed` (nothing was created) or
        `unknown` (kept for the TTL, until the watch shows the truth)."""
        with self._lock:
            key = ledger_key(name)
            if outcome == "unknown":
                reservation = (self._inflight.get(key) or {}).get(token)
                if reservation is not None:
                    reservation.deadline = self._clock() + self.config.reservation_ttl_s
                return
            if outcome == "created" and created is not None:
                self.upsert_elasticgpu(created, uid)  # ends every reservation of it
            self._drop_reservations(key, token)

    def egpu_holds(self) -> dict[str, Assignment]:
        """ElasticGPU name -> the cards it holds in the engine."""
        with self._lock:
            return {k[len(EGPU_KEY):]: a for k, a in self._holds.items() if k.startswith(EGPU_KEY)}

    # ---- scheduling -------------------------------------------------------------------------

    @contextmanager
    def _without(self, uid: str) -> Iterator[None]:
        """What-if: the engine as if this pod held nothing (a pod being re-placed may move)."""
        held = self._holds.get(uid)
        if held is None:
            yield
            return
        self.engine.release(uid)
        try:
            yield
        finally:
            self.engine.allocate(uid, held)

    def _prepare(self) -> None:
        self.require_ready()
        self._flush()
        self._refresh_workload()
        self.expire()

    def filter(self, pod: PodRequest, uid: str, node_names: Sequence[str]) -> FilterResult:
        """Which nodes can take the pod, and why each other one cannot (`_filter`); a GPU pod
        that fits none of them is remembered as waiting for capacity (`wakeups`).

        The failed nodes past `DETAIL_LIMIT` share a summary reason, filled in after the lock
        is released: on a request naming 20,000 nodes that loop is most of the call, and other
        requests (small filters, binds) must not wait behind it."""
        with self._lock:
            result, overflow = self._filter(pod, uid, node_names)
            self._note_filtered(pod, uid, node_names, result.feasible)
            known = self._known  # a frozenset, replaced whole when nodes change
        if not overflow:
            return result
        failed = dict(result.failed)
        for name in overflow:
            failed[name] = SUMMARY_FAILURE if name in known else UNKNOWN_NODE_FAILURE
        return FilterResult(result.feasible, failed)

    def _filter(self, pod: PodRequest, uid: str, node_names: Sequence[str]
                ) -> tuple[FilterResult, Sequence[str]]:
        """Which nodes can take the pod, and why each other one cannot.

        The engine explains a failed node by planning its cards, which costs about 0.1 ms per
        node: on a full 5,000-node cluster that is most of a second per pod (kube-scheduler
        only shows a count per distinct reason anyway). Past
        `DETAIL_LIMIT` failed nodes, feasibility comes from the engine's vectorised fit (the
        nodes `score` keeps) and only the first `DETAIL_LIMIT` failures are explained; the
        others are returned apart, for `filter` to name outside the lock.
        """
        with self._lock:
            self._prepare()
            with self._without(uid):
                if self.config.filter_result == "best":
                    # Narrowed answer: only the node the engine would choose. kube-scheduler
                    # skips scoring (and prioritize) when one node is left, so the decision is
                    # exactly the engine's and the cycle has one round trip instead of two.
                    best = self.engine.best(pod, node_names)
                    if best is not None:
                        return FilterResult([best], {}), ()
                if len(node_names) <= DETAIL_LIMIT:
                    return self.engine.filter(pod, node_names), ()
                scored = self.engine.scored(pod, node_names)
                # kube-scheduler asks prioritize next, for the nodes that passed: keep the
                # scores while nothing changes (one engine scoring per cycle, not two).
                self._last_scores = (uid, pod, self._version, scored)
                failed_names = scored.failed
                failed = dict(self.engine.filter(pod, failed_names[:DETAIL_LIMIT]).failed)
        return FilterResult(scored.feasible, failed), failed_names[DETAIL_LIMIT:]

    def prioritize(self, pod: PodRequest, uid: str, node_names: Sequence[str]) -> dict[str, int]:
        """Scores 0..10 (kube-scheduler's extender range), best node 10."""
        with self._lock:
            self._prepare()
            with self._without(uid):
                last = self._last_scores
                scored: ScoredNodes | None = None
                if last is not None and last[:3] == (uid, pod, self._version):
                    scored = last[3]
                    if scored.feasible != list(node_names):  # usually equal: the filter's answer
                        cached = scored.as_dict()
                        kept = [n for n in node_names if n in cached]
                        scored = ScoredNodes(kept, np.array([cached[n] for n in kept],
                                                            dtype=np.float64), [])
                elif pod.wants_gpu:
                    scored = self.engine.scored(pod, node_names)
        if scored is None:
            return dict.fromkeys(node_names, 0)
        return rescale_scored(scored, node_names)

    def _reservation_key(self, uid: str, token: int) -> str:
        return f"{uid}#bind{token}"

    def _allocate_reservation(self, uid: str, token: int, assignment: Assignment) -> None:
        self._version += 1
        try:
            self.engine.allocate(self._reservation_key(uid, token), assignment)
        except (Unschedulable, KeyError, ValueError) as err:
            log.warning("reservation of pod uid %s on %s cannot be counted: %s", uid,
                        assignment.node, getattr(err, "reason", err))

    def _drop_reservations(self, uid: str, token: int | None = None) -> None:
        self._version += 1
        reservations = self._inflight.get(uid)
        if not reservations:
            return
        for t in [token] if token is not None else list(reservations):
            dropped = reservations.pop(t, None)
            if dropped is not None:
                self.engine.release(self._reservation_key(uid, t))
                self._mark_freed(dropped.assignment.node)
            held = self._host_reserved.pop((uid, t), None)
            if held is not None:
                self._add_host(*held, sign=-1)
        if not reservations:
            del self._inflight[uid]
            if uid.startswith(EGPU_KEY):  # if the ElasticGPU was never made, pods naming it
                self._sync_consumers(uid[len(EGPU_KEY):])  # hold its cards themselves

    def reserve(self, pod: PodRequest, uid: str, node: str) -> tuple[int, Assignment]:
        """Choose cards on `node` and hold them now, before anything is written to the API.

        Returns a token for `settle`. Earlier reservations and holds of the same pod stay
        counted: until their outcome is known, any one of them may be the one that lands.
        """
        with self._lock:
            self._prepare()
            assignment = self.engine.assign(pod, node)
            return self._reserve_assignment(pod, uid, node, assignment), assignment

    def _reserve_assignment(self, pod: PodRequest, uid: str, node: str,
                            assignment: Assignment) -> int:
        self._tokens += 1
        token = self._tokens
        self.engine.allocate(self._reservation_key(uid, token), assignment)
        self._version += 1
        self._inflight.setdefault(uid, {})[token] = _Reservation(assignment)
        self._waiting.pop(uid, None)  # being bound: it waits no more
        self._claim_waiting.pop(uid, None)
        if pod.cpu_milli or pod.memory_mib:
            # its CPU and memory count from now, like its cards, until the bind's outcome
            self._host_reserved[(uid, token)] = (node, pod.cpu_milli, pod.memory_mib)
            self._add_host(node, pod.cpu_milli, pod.memory_mib, sign=+1)
        return token

    def settle(self, uid: str, token: int, outcome: str,
               pod: Mapping[str, Any] | None = None) -> None:
        """End a bind: `bound` (pass the bound pod, or it is taken from the reservation),
        `failed` (the API refused: nothing was written) or `unknown` (keep for the TTL)."""
        with self._lock:
            reservation = (self._inflight.get(uid) or {}).get(token)
            if outcome == "unknown":
                if reservation is not None:
                    reservation.deadline = self._clock() + self.config.reservation_ttl_s
                return
            if outcome == "bound":
                # `pod` is what we know the API holds now (bound, annotated), possibly before
                # the watch says so; a later watch event replaces it, an equal one is ignored.
                # A pod deleted right after its Binding landed can be seen gone before this
                # settles (the worker's reply and the watch event race): it stays gone.
                if pod is not None and uid not in self._gone:
                    info = PodInfo.from_manifest(pod)
                    current = self._pods.get(uid)
                    if current is None or not current.node_name:
                        if current is not None and current.resource_version is not None:
                            info = replace(info, resource_version=max(
                                current.resource_version, info.resource_version or 0))
                        self._index_consumer(uid, current, info)
                        self._pods[uid] = info
                self._drop_reservations(uid)
                self._sync(uid)
                self._count_host(uid)  # from the reservation to the bound pod, not the watch
                return
            self._drop_reservations(uid, token)

    def expire(self) -> int:
        """End reservations whose bind outcome stayed unknown past the TTL."""
        with self._lock:
            now = self._clock()
            late = [(uid, token) for uid, reservations in self._inflight.items()
                    for token, r in reservations.items() if r.deadline <= now]
            for uid, token in late:
                log.warning("reservation of pod uid %s expired; its bind never showed up", uid)
                self._drop_reservations(uid, token)
            return len(late)

    # ---- waking pending pods ---------------------------------------------------------------

    def _mark_freed(self, node: str) -> None:
        """Capacity on `node` may have grown (a hold or reservation released, inventory
        changed). Recorded only while some pod waits: a pod turned away later was turned away
        with this capacity in view."""
        if self._waiting:
            self._epoch += 1
            self._freed[node] = self._epoch

    def _note_filtered(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                       feasible: Sequence[str]) -> None:
        self._waiting.pop(uid, None)  # re-inserted last below: the dict stays oldest first
        if feasible or not pod.wants_gpu or not node_names:
            return
        self._waiting[uid] = Waiter(uid, pod, asked_nodes(node_names, len(self._known)),
                                    self._epoch, self._priority_of(pod, uid))
        while len(self._waiting) > MAX_WAITING:
            del self._waiting[next(iter(self._waiting))]
        self.wakeup_counts["turned_away"] += 1

    def wakeups(self, check_limit: int = 64, wake_limit: int = 32) -> list[Wake]:
        """The pending pods to wake now: turned away by the filter for GPU reasons, and now
        fitting on a node whose capacity freed since (`core.wakeup.plan_wakeups`). Each one is
        marked as having seen every freeing so far, so it is not woken again for the same one.
        """
        with self._lock:
            claimed = list(self._claim_wakes.values())
            self._claim_wakes.clear()
            self.wakeup_counts["woken"] += len(claimed)
            if not self._waiting:
                self._freed.clear()
                return claimed
            if not self.ready:
                return claimed
            self._flush()  # inventory changes are marked freed as they reach the engine
            self.expire()
            if not self._freed:
                return claimed
            plan = plan_wakeups(self.engine, list(self._waiting.values()), self._freed,
                                check_limit=check_limit, wake_limit=wake_limit)
            for uid in plan.checked:
                self._waiting[uid] = replace(self._waiting[uid], since=self._epoch)
            # a freeing every waiter has seen can never wake anyone again
            oldest = min(w.since for w in self._waiting.values())
            self._freed = {n: e for n, e in self._freed.items() if e > oldest}
            self.wakeup_counts["rounds"] += 1
            self.wakeup_counts["woken"] += len(plan.wake)
            return claimed + list(plan.wake)

    def wakeup_pending(self) -> bool:
        """Whether a wake-up round may find someone: pods wait and capacity freed (or an
        inventory change not yet in the engine may free some). A hint, read without the lock."""
        return bool(self._claim_wakes) or (bool(self._waiting) and bool(self._freed or self._dirty))

    def wakeup_done(self, wake: Wake, sent: bool, definite: bool = True) -> None:
        """A wake-up's outcome in the API. Refused (the pod is gone or was re-created): it
        waits no more. Not known to have landed (a timeout, a 5xx): its node counts as freed
        again, so the next round reconsiders it."""
        with self._lock:
            self.wakeup_counts["sent" if sent else "failed"] += 1
            if sent:
                return
            if definite:
                self._waiting.pop(wake.uid, None)
            elif wake.reason:
                self._claim_wakes[wake.uid] = wake  # a claim's wake-up: send it again
            elif wake.uid in self._waiting:
                self._mark_freed(wake.node)

    def waiting(self) -> dict[str, Waiter]:
        with self._lock:
            return dict(self._waiting)

    def wakeup_stats(self) -> tuple[int, dict[str, int]]:
        """(pods waiting for GPU capacity, counters: turned_away, rounds, woken, sent, failed)."""
        with self._lock:
            return len(self._waiting), dict(self.wakeup_counts)

    def preempt(self, pod: PodRequest, uid: str,
                candidates: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, tuple[list[str], int]]:
        """For each node, victims whose removal really frees the cards the pod needs.

        Starts from kube-scheduler's victims (they free what its plugins count: CPU, memory,
        pod slots and the node-level GPU count `node.elasticgpu.io/gpu-core`, which does not
        see cards) and, if their cards are not enough, adds lower-priority pods holding cards on
        that node, lowest priority and smallest hold first, until the pod fits; then gives back
        every added pod the fit does not need (highest priority, largest hold first). Only pods
        of lower priority than the preemptor are ever added; kube-scheduler's own victims are
        kept (they may free something the extender does not see). Nodes where it cannot fit are
        left out.
        """
        with self._lock:
            self._prepare()
            preemptor_priority = self._priority_of(pod, uid)
            out: dict[str, tuple[list[str], int]] = {}
            with self._without(uid):
                for node, (victims, pdb) in candidates.items():
                    chosen = self._victims_on(pod, node, list(victims), preemptor_priority)
                    if chosen is not None:
                        out[node] = (chosen, pdb)
            return out

    def _priority_of(self, pod: PodRequest, uid: str) -> int:
        info = self._pods.get(uid)
        return info.priority if info is not None else 0

    def _victims_on(self, pod: PodRequest, node: str, victims: list[str],
                    preemptor_priority: int) -> list[str] | None:
        if node not in self._known:
            return None
        released: list[tuple[str, Assignment]] = []

        def release(victim: str) -> None:
            held = self._holds.get(victim)
            if held is not None and held.node == node and self.engine.allocation(victim) is not None:
                self.engine.release(victim)
                released.append((victim, held))

        try:
            for victim in victims:
                release(victim)
            if self.engine.filter(pod, [node]).feasible:
                return victims
            extra = sorted(
                (uid for uid in self._node_pods.get(node, ())
                 if uid not in victims and uid in self._pods
                 and self._pods[uid].priority < preemptor_priority),
                key=lambda u: (self._pods[u].priority, sum(s.milli for s in self._holds[u].shares())))
            added: list[str] = []
            for uid in extra:
                release(uid)
                added.append(uid)
                if self.engine.filter(pod, [node]).feasible:
                    return list(victims) + self._reprieve(pod, node, added, released)
            return None
        finally:
            for victim, held in reversed(released):
                self.engine.allocate(victim, held)

    def _reprieve(self, pod: PodRequest, node: str, added: list[str],
                  released: list[tuple[str, Assignment]]) -> list[str]:
        """Of the pods `_victims_on` added (all released, the pod fits), those the fit needs:
        each is put back in turn, highest priority and largest hold first, and stays back when
        the pod still fits (a low-priority pod on a card that did not help is not evicted)."""
        held = dict(released)
        order = sorted(added, key=lambda u: (-self._pods[u].priority,
                                             -sum(s.milli for s in held[u].shares())))
        needed = set(added)
        for uid in order:
            self.engine.allocate(uid, held[uid])
            if self.engine.filter(pod, [node]).feasible:
                needed.discard(uid)
            else:
                self.engine.release(uid)
        return [uid for uid in added if uid in needed]

    # ---- views ------------------------------------------------------------------------------

    def holds(self) -> dict[str, Assignment]:
        with self._lock:
            return dict(self._holds)

    def inflight(self) -> dict[str, list[Assignment]]:
        with self._lock:
            return {uid: [r.assignment for r in rs.values()] for uid, rs in self._inflight.items()}

    def conflicts(self) -> dict[str, str]:
        return dict(self._conflicts)

    def distrusted(self) -> dict[str, str]:
        """uid -> why the live pod's assignment annotation is not counted."""
        with self._lock:
            return dict(self._distrusted)

    def card_usage(self) -> dict[str, list[tuple[int, int, int]]]:
        with self._lock:
            self._flush()
            return {name: self.engine.card_usage(name) for name in self.engine.nodes()}

    def cards(self) -> dict[str, tuple[Card, ...]]:
        """Each known node's cards as the engine has them (uuid, model, health, capacity)."""
        with self._lock:
            self._flush()
            return {name: self.engine.node(name).cards for name in self.engine.nodes()}

    def pod_shares(self) -> list[tuple[str, str, Assignment]]:
        """(namespace, pod name, the cards it holds) of every pod whose assignment the ledger
        holds (reservations of binds in flight are not listed; ElasticGPUs' holds are
        `egpu_holds`)."""
        with self._lock:
            out = []
            for uid, assignment in self._holds.items():
                pod = self._pods.get(uid)
                if pod is not None:
                    out.append((pod.namespace, pod.name, assignment))
            return out

    def host_usage(self) -> dict[str, tuple[int, int]]:
        """(CPU milli, memory MiB) that the bound pods of each known node ask for."""
        with self._lock:
            self._flush()
            return {name: self._host_total.get(name, (0, 0)) for name in self.engine.nodes()}

    def workload_size(self) -> tuple[int, int]:
        """(live pods counted for the observed workload, shapes of the workload in use)."""
        with self._lock:
            return len(self._shapes), len(self.engine.ctx.frag.workload.shapes)

    def node_names(self) -> list[str]:
        with self._lock:
            self._flush()
            return self.engine.nodes()


def without_containers(pod: PodRequest, containers: Iterable[str]) -> PodRequest:
    """The pod without some containers' GPU requests (claim-backed containers: their cards
    are their ElasticGPU's)."""
    drop = set(containers)
    if not drop:
        return pod
    return replace(pod, containers=tuple(c for c in pod.containers if c.name not in drop))


def rescale_scored(scored: ScoredNodes, node_names: Sequence[str]) -> dict[str, int]:
    """`rescale` on arrays: the same arithmetic per node, without a Python loop over them."""
    out = dict.fromkeys(node_names, 0)
    values = scored.scores
    if values.size == 0:
        return out
    low, high = float(values.min()), float(values.max())
    span = high - low
    if span <= 0:
        out.update(dict.fromkeys(scored.feasible, 10))
        return out
    scale = 10.0 / span
    # int() of a non-negative float truncates, as astype does
    out.update(zip(scored.feasible, ((values - low) * scale + 0.5).astype(np.int64).tolist(),
                   strict=True))
    return out


def rescale(raw: Mapping[str, float], node_names: Sequence[str]) -> dict[str, int]:
    """Engine scores (any range, higher better) -> kube-scheduler's 0..10, best node 10.

    Nodes without a score (unknown, or a pod without GPUs) get 0: they add nothing.
    """
    out = dict.fromkeys(node_names, 0)
    if not raw:
        return out
    low, high = min(raw.values()), max(raw.values())
    span = high - low
    if span <= 0:
        out.update(dict.fromkeys(raw, 10))
        return out
    scale = 10.0 / span
    for name, value in raw.items():
        out[name] = int((value - low) * scale + 0.5)
    return out
