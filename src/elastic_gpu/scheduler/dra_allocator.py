"""The DRA allocator: ResourceClaims of our card and MIG classes placed by our engine
(docs/dra.md, "Claims placed by our engine"; MIG instances by the engine's own rule,
`core.mig.pick`, not kube-scheduler's first fit).

The webhook gates a pod whose claims are of our classes (`elasticgpu.io/dra-placement`); this
allocator, in the extender's process and acting only while its replica serves (the extender's
Lease: one leader, the same failover), places all of the pod's claims at once with the
placement `Engine`, the extender's node and card policies (FGD binpack by default), writes each
claim's finalizer and `status.allocation` (the node as its `nodeSelector`), then lifts the gate.
Stock kube-scheduler then binds the pod: for an allocated claim its DynamicResources plugin only
applies the node selector, skips Reserve and adds the pod to `reservedFor` at PreBind.

The engine is rebuilt for each pass from this driver's ResourceSlices (the cards) and every
allocated claim (`core.dra.inventory`): whoever allocated a claim, kube-scheduler included, its
devices are held, so a restarted allocator, or a new leader, starts from exactly what the API
holds and allocates nothing twice. Claims whose allocation is written but not yet seen back
through the watch are held from memory (`_pending`).

Throughput: a pass places every gated pod it sees (pure, in memory), then writes concurrently
(`concurrency` requests in flight): per claim a finalizer patch and a status patch, per pod one
gate patch. The informers' stores are the only reads.

A gate is lifted once the written allocations are seen back, no pod is left in kube-scheduler's
hands (`core.dra.turn`, `TURN_S` at most) and `settle_s` more has passed, and only when no card
they hold is over (kube-scheduler allocated its room from a cache that lagged ours): else they
are cleared while the pod is still gated (unreserved), an Event says so, and it is placed again.
A pod whose allocation kube-scheduler's PostFilter cleared (no room on the node for its CPU or
memory) is placed again at the next pass (`_placed`), or by kube-scheduler meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.dra.capacity_guard import TAKEN_BACK_REASON, given_twice, taken_back_message
from elastic_gpu.core.dra.claim_placement import (
    ALLOCATION_FINALIZER,
    WAITING_REASON,
    DeviceAsk,
    NodeFacts,
    Unplaceable,
    allocation,
    best_choice,
    claim_asks,
    claim_assignment,
    device_count,
    eligible_nodes,
    waiting_message,
)
from elastic_gpu.core.dra.devices import DRIVER, card_percent, mig_device
from elastic_gpu.core.dra.inventory import (
    CLAIM_KEY_PREFIX,
    allocated_pools,
    claim_hold,
    claim_key,
    placeable_cards,
    tables_of,
)
from elastic_gpu.core.dra.nodemode import DRA_NODE_SELECTOR
from elastic_gpu.core.dra.pods import claim_names
from elastic_gpu.core.dra.turn import TURN_S, Turn, retries_on_claim, retries_on_slice
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.model import Node
from elastic_gpu.core.nodeaffinity import taints_from_node
from elastic_gpu.core.nodestatus import allocatable
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.kube.client import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, KubeClient
from elastic_gpu.kube.errors import ApiError, Conflict, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING, EventRecorder
from elastic_gpu.kube.informer import Handler, Informer, object_key, on_any_change
from elastic_gpu.kube.resources import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

log = logging.getLogger(__name__)

Obj = dict[str, Any]


#: The Events' source component.
EVENT_COMPONENT = "egpu-scheduler"

#: How long a written allocation the watch never showed is held from memory, once no write is
#: in flight (the claim was deallocated or replaced before its event reached us).
PENDING_S = 10.0


@dataclass(frozen=True)
class AllocatorSettings:
    """What the allocator takes from the extender's config."""

    scheduler_names: tuple[str, ...]
    node_policy: str
    card_policy: str | None = None
    seed: int = 0
    #: writes in flight at once
    concurrency: int = 64
    #: how long after its allocation is seen back a gate waits before it is lifted, for an
    #: allocation kube-scheduler made meanwhile from a cache that lagged ours to show up
    settle_s: float = 0.25
    #: how long a pod counts as in kube-scheduler's hands at most (`core.dra.turn`)
    turn_s: float = TURN_S


@dataclass
class Job:
    """One pod's writes: the claims' allocations (none: only the gate), then the gate."""

    namespace: str
    pod: str
    uid: str
    gates: list[Obj]
    #: (claim name, claim resourceVersion, allocation)
    claims: list[tuple[str, str, Obj, bool]] = field(default_factory=list)
    lift_gate: bool = True
    #: a gate lifted for kube-scheduler's own allocator: only once none of our allocations is
    #: in flight or unseen, or it could allocate a card ours are taking (its cache lags them)
    handover: bool = False


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(g, Mapping) and g.get("name") == ann.DRA_PLACEMENT_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


class DraAllocator:
    """Informers over pods not yet bound, claims, this driver's slices, DRA nodes and classes;
    passes that place gated pods while `serving()` says this replica serves."""

    def __init__(self, client: KubeClient, settings: AllocatorSettings,
                 serving: Callable[[], bool] = lambda: True,
                 recorder: EventRecorder | None = None) -> None:
        self.client = client
        self.settings = settings
        self.serving = serving
        #: Events on pods that wait gated for room or whose claims were taken back (run by `run`)
        self.recorder = recorder or EventRecorder(client, EVENT_COMPONENT)
        #: pod uid -> the waiting message last recorded on it (one Event per change, not per
        #: pass)
        self._waiting: dict[str, str] = {}
        self.pods = Informer(client, PODS.path(), name="dra allocator pods",
                             params={"fieldSelector": "spec.nodeName="})
        # a cluster without resource.k8s.io/v1 (404): empty, checked again now and then
        self.claims = Informer(client, RESOURCE_CLAIMS.path(), name="dra allocator claims",
                               missing_ok=True)
        self.slices = Informer(client, RESOURCE_SLICES.path(), name="dra allocator slices",
                               params={"fieldSelector": f"spec.driver={DRIVER}"},
                               missing_ok=True)
        # the DRA-mode Nodes (labels, taints, allocatable): only their agents publish this
        # driver's slices (it refuses a node without the label); every other Node's heartbeats
        # would be encoded by kube-apiserver and decoded here for nothing
        self.nodes = Informer(client, NODES.path(), name="dra allocator nodes",
                              params={"labelSelector": DRA_NODE_SELECTOR})
        self.classes = Informer(client, DEVICE_CLASSES.path(), name="dra allocator classes",
                                missing_ok=True)
        self._informers = (self.pods, self.claims, self.slices, self.nodes, self.classes)
        self._wake = asyncio.Event()
        #: claim key -> what it holds, written (or being written) but not yet seen allocated
        self._pending: dict[str, Assignment] = {}
        #: when each pending hold was placed (one never seen back is dropped after PENDING_S)
        self._written: dict[str, float] = {}
        #: pod uids whose writes are in flight, and those whose gate was lifted
        self._busy: set[str] = set()
        self._lifted: set[str] = set()
        #: unbound pods kube-scheduler may allocate a card for, since when (`core.dra.turn`)
        self._turn = Turn(settings.turn_s)
        #: pod uids this allocator placed (placed again when their allocation is cleared)
        self._placed: set[str] = set()
        self._limit = asyncio.Semaphore(settings.concurrency)
        #: the nodes' labels and taints of this pass (`_engine`)
        self._facts: dict[str, NodeFacts] = {}
        #: this pass's eligible nodes by the pods' placement fields
        self._eligible: dict[str, list[str]] = {}
        #: this pass's MIG instances' device names: node -> instance uuid -> device
        self._mig_devices: dict[str, dict[str, str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: when the writes now in flight began, and for how many pods
        self._burst = (0.0, 0)
        self.placed_count = 0
        #: pods whose allocations were cleared before their gate lifted (given twice)
        self.cleared_count = 0
        #: the unbound pods naming ResourceClaims (immutable), in the order they came: the
        #: only pods a pass looks at; the others' events wake no pass
        self._claimants: dict[str, None] = {}
        for informer in (self.nodes, self.classes):
            informer.add_handler(on_any_change(self._wake.set))
        # the changes after which kube-scheduler retries its unschedulable pods (`core.dra.turn`)
        retry, slice_, claim = self._retry, retries_on_slice, retries_on_claim
        self.slices.add_handler(Handler(on_add=lambda s: retry(slice_(None, s)),
                                        on_update=lambda o, n: retry(slice_(o, n)), on_delete=self._poke))
        self.claims.add_handler(Handler(on_add=self._poke, on_update=lambda o, n: retry(claim(o, n)),
                                        on_delete=lambda c: retry(claim(c, None))))
        self.pods.add_handler(Handler(on_add=self._pod_added, on_update=self._pod_updated,
                                      on_delete=self._pod_deleted))

    def _poke(self, _obj: Obj) -> None:
        self._wake.set()

    def _retry(self, retries: bool) -> None:
        if retries:
            self._turn.changed(time.monotonic())
        self._wake.set()

    def _pod_added(self, pod: Obj) -> None:
        self._turn.seen(object_key(pod), pod, time.monotonic())
        if (pod.get("spec") or {}).get("resourceClaims"):
            self._claimants[object_key(pod)] = None
            self._wake.set()

    def _pod_updated(self, _old: Obj, new: Obj) -> None:
        self._pod_added(new)

    def _pod_deleted(self, pod: Obj) -> None:
        key = object_key(pod)
        self._turn.gone(key)
        if key in self._claimants:
            del self._claimants[key]
            self._forget(pod)
            self._wake.set()

    def _forget(self, pod: Obj) -> None:
        """A pod bound (it leaves the unbound pods' watch) or deleted: nothing more to do."""
        uid = str(_meta(pod).get("uid", ""))
        self._placed.discard(uid)
        self._lifted.discard(uid)
        self._waiting.pop(uid, None)

    async def run(self, period_s: float = 1.0, batch_s: float = 0.01) -> None:
        """List and watch, and place until cancelled."""
        watchers = [asyncio.create_task(i.run(), name=i.name) for i in self._informers]
        watchers.append(asyncio.create_task(self.recorder.run(), name="dra allocator events"))
        try:
            for informer in self._informers:
                await informer.wait_synced()
            log.info("DRA allocator: caches synced (%d claims, %d slices)",
                     len(self.claims.store), len(self.slices.store))
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), period_s)
                await asyncio.sleep(batch_s)  # the events of one burst make one pass
                self._wake.clear()
                if not self.serving():
                    continue
                started = time.perf_counter()
                jobs = self.plan()
                quiet = not self._pending and not self._tasks
                for job in jobs:
                    if not job.handover or quiet:
                        self._start(job)  # a handover waits for a quiet pass (1 s at most)
                if jobs:
                    log.info("DRA allocator: %d pods placed in %.1f ms (%d writes in flight)",
                             sum(1 for j in jobs if j.claims), 1000 * (time.perf_counter()
                                                                        - started),
                             len(self._tasks))
        finally:
            for task in (*watchers, *self._tasks):
                task.cancel()
            await asyncio.gather(*watchers, *self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ deciding

    def _engine(self) -> tuple[Engine, dict[str, dict[int, tuple[int, int]]]]:
        # the cards, MIG-carved ones with their instances (the MIG class's devices)
        cards = placeable_cards(self.slices.items())
        nodes = {object_key(n): n for n in self.nodes.items()}
        # CPU and memory capacity for the policies' host-aware scoring; kube-scheduler checks
        # the pod's fit itself (check_host_resources off)
        engine = Engine((Node(name, allocatable(nodes[name], "cpu", 1000),
                              allocatable(nodes[name], "memory") // 2**20, tuple(cs),
                              labels=dict(_meta(nodes[name]).get("labels") or {}))
                         for name, cs in sorted(cards.items()) if name in nodes),
                        PolicyConfig(node_policy=self.settings.node_policy,
                                     card_policy=self.settings.card_policy,
                                     check_host_resources=False),
                        seed=self.settings.seed)
        # labels and taints of the engine's nodes, for the pods' node filter (`eligible_nodes`)
        self._facts = {name: NodeFacts(engine.node(name).labels, taints_from_node(nodes[name]))
                       for name in engine.nodes()}
        self._eligible = {}
        tables = tables_of(cards)
        for claim in self.claims.items():
            meta = _meta(claim)
            key = claim_key(str(meta.get("namespace")), str(meta.get("name")))
            hold = claim_hold(claim, tables)
            if hold is None:
                continue
            self._pending.pop(key, None)
            self._hold(engine, key, hold)
        for key, hold in list(self._pending.items()):
            self._hold(engine, key, hold)
        sizes = {name: {c.index: (c.memory_mib, card_percent(c)) for c in cs}
                 for name, cs in cards.items()}
        self._mig_devices = {name: {i.uuid: mig_device(c.index, i) for c in cs for i in c.mig}
                             for name, cs in cards.items()}
        return engine, sizes

    @staticmethod
    def _hold(engine: Engine, key: str, hold: Assignment) -> None:
        if hold.node not in engine.nodes():
            return
        try:
            engine.allocate(key, hold)
        except Unschedulable as err:
            # an allocation someone else wrote past a card's capacity: a fact we cannot undo
            log.warning("DRA allocator: %s holds more than a card has: %s", key, err)

    def _candidates(self) -> list[Obj]:
        names = set(self.settings.scheduler_names)
        out = []
        for key in self._claimants:
            pod = self.pods.get(key)
            if pod is None:
                continue
            meta, spec = _meta(pod), pod.get("spec") or {}
            uid = str(meta.get("uid", ""))
            if (spec.get("schedulerName", "default-scheduler") not in names
                    or spec.get("nodeName") or meta.get("deletionTimestamp")
                    or uid in self._busy or not spec.get("resourceClaims")):
                continue
            gated = is_gated(pod)
            if gated and uid in self._lifted:
                continue
            if not gated:
                self._lifted.discard(uid)
                if uid not in self._placed or not self._lost_allocation(pod):
                    continue
            out.append(pod)
        out.sort(key=lambda p: (str(_meta(p).get("creationTimestamp", "")),
                                str(_meta(p).get("name", ""))))
        return out

    def _lost_allocation(self, pod: Mapping[str, Any]) -> bool:
        """Whether some claim of a pod this allocator placed is no longer allocated (cleared by
        kube-scheduler's PostFilter): it is placed again."""
        namespace = str(_meta(pod).get("namespace", ""))
        for name in claim_names(pod).values():
            claim = self.claims.get(f"{namespace}/{name}")
            if (claim is not None and not (claim.get("status") or {}).get("allocation")
                    and claim_key(namespace, name) not in self._pending):
                return True
        return False

    def _opted_out(self, claim: Mapping[str, Any]) -> bool:
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            if not isinstance(request, Mapping):
                continue
            exactly = request.get("exactly")
            options = [exactly] if isinstance(exactly, Mapping) else [
                o for o in request.get("firstAvailable") or [] if isinstance(o, Mapping)]
            for option in options:
                cls = self.classes.get(str(option.get("deviceClassName")))
                if cls is not None and ((_meta(cls).get("annotations") or {}).get(
                        ann.DRA_PLACEMENT) == ann.DRA_PLACEMENT_KUBE_SCHEDULER):
                    return True
        return False

    def plan(self) -> list[Job]:
        """One pass: every gated pod of our schedulers placed in memory, as writes to do."""
        now = time.monotonic()
        for key in list(self._pending):
            namespace, _, name = key.removeprefix(CLAIM_KEY_PREFIX).partition("/")
            claim = self.claims.get(f"{namespace}/{name}")
            # seen back (the cache holds it now), gone, or written long ago and deallocated
            # since (its watch event passed us by): no longer ours to hold from memory
            if (claim is None or (claim.get("status") or {}).get("allocation")
                    or (not self._tasks and now - self._written.get(key, now) > PENDING_S)):
                del self._pending[key]
        for key in [k for k in self._written if k not in self._pending]:
            del self._written[key]
        pods = self._candidates()
        if not pods:
            return []
        engine, sizes = self._engine()
        jobs = []
        for pod in pods:
            job = self._place(engine, sizes, pod)
            if job is not None:
                jobs.append(job)
        return jobs

    def _place(self, engine: Engine, sizes: Mapping[str, Mapping[int, tuple[int, int]]],
               pod: Obj) -> Job | None:
        meta, spec = _meta(pod), pod.get("spec") or {}
        namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        gates = list(spec.get("schedulingGates") or [])
        gated = is_gated(pod)
        job = Job(namespace, name, uid, gates, lift_gate=gated)
        names = claim_names(pod)
        if len(names) < len(spec.get("resourceClaims") or []):
            return None  # a template's claim is not created yet
        claims = [self.claims.get(f"{namespace}/{c}") for c in names.values()]
        if any(c is None for c in claims):
            return None
        open_claims: list[tuple[Obj, list[DeviceAsk]]] = []
        allocated_nodes: set[str] = set()
        try:
            for claim in claims:
                assert claim is not None
                status = claim.get("status") or {}
                if status.get("allocation"):
                    allocated_nodes.update(allocated_pools(claim))
                    continue
                if self._opted_out(claim):
                    raise Unplaceable("its class is left to kube-scheduler")
                open_claims.append((claim, claim_asks(claim)))
        except Unplaceable as why:
            log.info("DRA allocator: %s/%s is kube-scheduler's to place: %s", namespace, name, why)
            job.handover = True
            return job if gated else None
        if not open_claims:
            return job if gated else None  # allocated already (e.g. before a restart)
        named = [(str(_meta(c)["name"]), asks) for c, asks in open_claims]
        # pods of one burst mostly share their placement fields: one answer for all of them
        key = repr((spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations"),
                    sorted(allocated_nodes)))
        try:
            candidates = self._eligible.get(key)
            if candidates is None:
                candidates = self._eligible[key] = eligible_nodes(pod, self._facts,
                                                                  sorted(allocated_nodes))
        except Unplaceable as why:
            log.info("DRA allocator: %s/%s is kube-scheduler's to place: %s", namespace, name, why)
            job.handover = True
            return job if gated else None
        choice = best_choice(engine, namespace, name, uid, named, candidates)
        request, node = choice.request, choice.node
        if node is None:
            if choice.fits_empty or choice.carvable:
                # room may free (or dynamic MIG carve an instance: the controller counts pods
                # our gate holds): it waits gated (SchedulingGated), placed by us then; an
                # Event says why, once per change of the reason
                message = waiting_message(engine.filter(request, candidates).failed)
                if self._waiting.get(uid) != message:
                    self._waiting[uid] = message
                    log.info("DRA allocator: %s/%s %s", namespace, name, message)
                    self.recorder.record({**pod, "apiVersion": "v1", "kind": "Pod"}, NORMAL,
                                         WAITING_REASON, message)
                return None
            # no DRA node could ever hold it: kube-scheduler says why on the pod
            log.info("DRA allocator: no DRA node can hold %s/%s; left to kube-scheduler",
                     namespace, name)
            job.handover = True
            return job if gated else None
        try:
            assignment = engine.assign(request, node)
        except Unschedulable as err:
            log.warning("DRA allocator: %s/%s on %s: %s", namespace, name, node, err)
            return None
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for claim, asks in open_claims:
            cmeta = _meta(claim)
            cname = str(cmeta["name"])
            part = claim_assignment(assignment, cname, asks)
            key = claim_key(namespace, cname)
            self._hold(engine, key, part)
            self._pending[key] = part
            self._written[key] = time.monotonic()
            ids = [str(uuid.uuid4()) for _ in range(device_count(asks))]
            body = allocation(assignment, cname, asks, sizes[node], ids, now,
                              self._mig_devices.get(node, {}))
            has_finalizer = ALLOCATION_FINALIZER in (cmeta.get("finalizers") or [])
            job.claims.append((cname, str(cmeta.get("resourceVersion", "")), body,
                               has_finalizer))
        self._placed.add(uid)
        return job

    # ------------------------------------------------------------------ writing

    def _start(self, job: Job) -> None:
        if not self._tasks:
            self._burst = (time.perf_counter(), 0)
        self._burst = (self._burst[0], self._burst[1] + 1)
        self._busy.add(job.uid)
        task = asyncio.create_task(self._write(job), name=f"dra-allocate {job.pod}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            log.info("DRA allocator: %d pods' writes done in %.2f s", self._burst[1],
                     time.perf_counter() - self._burst[0])

    async def _write(self, job: Job) -> None:
        try:
            results = await asyncio.gather(*(self._write_claim(job.namespace, *c)
                                             for c in job.claims))
            if all(results) and job.claims and job.lift_gate and not await self._settled(job):
                return  # given twice: cleared while the pod is gated, placed again next pass
            if all(results) and job.lift_gate:
                await self._lift(job)
            if all(results) and job.claims:
                self.placed_count += 1
        except Exception:
            log.exception("DRA allocator: writing %s/%s failed", job.namespace, job.pod)
            for cname, *_ in job.claims:
                self._pending.pop(claim_key(job.namespace, cname), None)
        finally:
            self._busy.discard(job.uid)
            self._wake.set()

    def _allocation(self, namespace: str, name: str) -> Any:
        return ((self.claims.get(f"{namespace}/{name}") or {}).get("status") or {}).get(
            "allocation")

    async def _settled(self, job: Job) -> bool:
        """Before the gate is lifted (the claims unreserved, so still ours to take back): once
        the watch shows the written allocations, and `settle_s` later, whether a card they
        hold is now over (kube-scheduler allocated its room from a cache that had not seen
        ours: a pod its tenant ungated, another class). Over: our claims are cleared, and
        False (the pod stays gated and is placed again)."""
        names = [c[0] for c in job.claims]
        keys = [claim_key(job.namespace, n) for n in names]
        deadline = time.monotonic() + PENDING_S
        while not all(self._allocation(job.namespace, n) for n in names):
            if time.monotonic() > deadline:
                return True  # never seen back: nothing to check against (as before)
            await asyncio.sleep(0.02)
        while (self._turn.busy(time.monotonic(), self.pods.get, self.claims.get)
               and time.monotonic() < deadline):
            await asyncio.sleep(0.02)  # kube-scheduler's turn: its allocation comes first
        await asyncio.sleep(self.settings.settle_s)
        found = given_twice(job.namespace, names, self.claims.items(), self.slices.items())
        if not found:
            return True
        message = taken_back_message(names, found)
        log.warning("DRA allocator: %s/%s: %s", job.namespace, job.pod, message)
        self.recorder.record({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": job.pod, "namespace": job.namespace, "uid": job.uid}}, WARNING,
            TAKEN_BACK_REASON, message)
        for name in names:
            claim = self.claims.get(f"{job.namespace}/{name}") or {}
            with contextlib.suppress(Conflict, NotFound):
                async with self._limit:
                    await self.client.patch(
                        RESOURCE_CLAIMS.path(job.namespace, name, "status"),
                        {"metadata": {"resourceVersion": str(_meta(claim).get(
                            "resourceVersion", ""))}, "status": {"allocation": None}},
                        content_type=MERGE_PATCH)
        while (any(self._allocation(job.namespace, n) for n in names)
               and time.monotonic() < deadline):
            await asyncio.sleep(0.02)  # the next pass must not read our allocation back
        for key in keys:
            self._pending.pop(key, None)
        self.cleared_count += 1
        return False

    async def _write_claim(self, namespace: str, name: str, version: str, body: Obj,
                           has_finalizer: bool) -> bool:
        path = RESOURCE_CLAIMS.path(namespace, name)
        try:
            async with self._limit:
                if not has_finalizer:
                    claim = await self.client.patch(
                        path, {"metadata": {"finalizers": [ALLOCATION_FINALIZER],
                                            "resourceVersion": version}},
                        content_type=STRATEGIC_PATCH)
                    version = str(_meta(claim).get("resourceVersion", ""))
                await self.client.patch(
                    RESOURCE_CLAIMS.path(namespace, name, "status"),
                    {"metadata": {"resourceVersion": version}, "status": {"allocation": body}},
                    content_type=MERGE_PATCH)
            return True
        except (Conflict, NotFound) as err:
            # changed under us (kube-scheduler allocated it, it was deleted): the next pass
            # reads what it is now
            log.info("DRA allocator: claim %s/%s: %s; placing again", namespace, name, err)
            self._pending.pop(claim_key(namespace, name), None)
            return False

    async def _lift(self, job: Job) -> None:
        rest = [g for g in job.gates if g.get("name") != ann.DRA_PLACEMENT_GATE]
        ops: list[Obj] = [{"op": "test", "path": "/spec/schedulingGates", "value": job.gates}]
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": rest} if rest
                   else {"op": "remove", "path": "/spec/schedulingGates"})
        try:
            async with self._limit:
                await self.client.patch(PODS.path(job.namespace, job.pod), ops,
                                        content_type=JSON_PATCH)
            self._lifted.add(job.uid)
        except NotFound:
            # the pod was deleted before its gate was lifted: its claims are released by the
            # claims' own watch, so there is nothing left to lift
            return
        except ApiError as err:  # another gate changed meanwhile: the next pass tries again
            log.info("DRA allocator: lifting %s/%s's gate: %s", job.namespace, job.pod, err)

