"""The ledger: what holds cards in the engine, derived from the API, and the binds in flight.

A bound pod holds what its assignment annotation names (`PodInfo.held`); an ElasticGPU holds
its cards under its ledger key; a bind in flight holds what it reserved, under its own engine
key, until its outcome is known (bound, failed) or its TTL runs out (unknown). One object,
because those three decide together what a key holds: a pod whose bind did not land holds its
defragmentation reservation again, and a pod using an ElasticGPU's cards holds them itself
while the ElasticGPU is not counted (`_egpu_counted`: it exists, or is being created).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.defrag import reservation as defrag_reservation
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.request import PodRequest
from elastic_gpu.scheduler.slim import TERMINAL_PHASES
from elastic_gpu.scheduler.state.conflicts import Conflicts
from elastic_gpu.scheduler.state.handle import EGPU_KEY, StateHandle
from elastic_gpu.scheduler.state.records import PodInfo, Reservation

log = logging.getLogger(__name__)

#: UIDs of deleted pods (and ElasticGPUs) remembered, so that a bind settling after the
#: deletion was seen does not bring the pod (and its cards) back; UIDs are never reused.
MAX_GONE = 10_000


class Waiters(Protocol):
    """What the ledger tells the pods waiting for capacity (`Wakeups`)."""

    def mark_freed(self, node: str) -> None: ...

    def stop_waiting(self, uid: str) -> None: ...

    def forget(self, uid: str) -> None: ...

    def keep_only(self, uids: Collection[str]) -> None: ...


class Usage(Protocol):
    """What the ledger tells the pods' usage (`PodUsage`) as pods come, go and are reserved
    for."""

    def count_host(self, uid: str, pod: PodInfo | None) -> None: ...

    def count_shape(self, uid: str, pod: PodInfo | None) -> None: ...

    def reserve_host(self, uid: str, token: int, node: str, cpu: int, mem: int) -> None: ...

    def release_host(self, uid: str, token: int) -> None: ...

    def hand_host_to_pod(self, uid: str, token: int) -> None: ...

    def push_host(self) -> None: ...


class Ledger:
    """Pods and ElasticGPUs from the API, what they hold in the engine, and the reservations
    of binds and ElasticGPU creations in flight."""

    def __init__(self, handle: StateHandle, usage: Usage, waiters: Waiters) -> None:
        self._h = handle
        self._usage = usage
        self._waiters = waiters
        self._pods: dict[str, PodInfo] = {}  # uid -> latest version seen
        self._gone: OrderedDict[str, None] = OrderedDict()  # uids seen deleted, newest last
        self._inflight: dict[str, dict[int, Reservation]] = {}  # uid -> token -> reservation
        self._tokens = 0
        #: the earliest deadline of a reservation kept for the TTL (`expire` scans none before)
        self._next_deadline = float("inf")
        self._holds: dict[str, Assignment] = {}  # uid -> what the engine has allocated
        #: ElasticGPU name -> what it holds: `_holds`' ElasticGPU keys, kept beside it so a
        #: reader of them (`egpu_holds`, on every scrape) is not a walk of every pod's hold
        self._egpu_holds: dict[str, Assignment] = {}
        self._node_pods: dict[str, set[str]] = {}  # node -> uids holding cards there
        #: what could not be counted, counted again as soon as its node's holds shrink
        self._conflicts = Conflicts()
        #: uid -> expiry (wall clock) of the defragmentation reservation it holds (a pending
        #: pod: its `_holds` entry is the reservation's cards)
        self._reserved_until: dict[str, float] = {}
        #: uid -> why its assignment is not the scheduler's (not counted; logged once)
        self._distrusted: dict[str, str] = {}
        #: The ElasticGPUs as the watches show them (core types), and ElasticGPU object UIDs
        #: seen deleted (a create's answer arriving after the deletion stays gone).
        self._egpus: dict[str, claims_model.ElasticGPU] = {}
        self._egpu_uids: dict[str, str] = {}
        self._egpus_gone: OrderedDict[str, None] = OrderedDict()
        #: ElasticGPU name -> uids of the pods whose assignment uses its cards: they hold
        #: those cards themselves while it is not counted (`_egpu_counted`)
        self._egpu_consumers: dict[str, set[str]] = {}

    # ---- what a key holds ---------------------------------------------------------------------

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
                                            stopped=pod.stopped, now=self._h.wall()):
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

    def sync_consumers(self, name: str) -> None:
        """ElasticGPU `name` started or stopped being counted: its consumers give its cards
        back to it, or take them over (the card stays held either way)."""
        for uid in sorted(self._egpu_consumers.get(name, ())):
            self.sync(uid)

    def _put_hold(self, key: str, assignment: Assignment) -> None:
        self._holds[key] = assignment
        self._node_pods.setdefault(assignment.node, set()).add(key)
        if key.startswith(EGPU_KEY):
            self._egpu_holds[key[len(EGPU_KEY):]] = assignment

    def _drop_hold(self, key: str) -> Assignment | None:
        if key.startswith(EGPU_KEY):
            self._egpu_holds.pop(key[len(EGPU_KEY):], None)
        old = self._holds.pop(key, None)
        if old is not None:
            self._node_pods.get(old.node, set()).discard(key)
        return old

    def set_hold(self, uid: str, assignment: Assignment | None) -> None:
        self._h.bump()
        old = self._drop_hold(uid)
        if old is not None:
            self._h.engine.release(uid)
            self._waiters.mark_freed(old.node)
        self._conflicts.clear(uid)
        if assignment is not None:
            self._count(uid, assignment)
        if old is not None and self._holds.get(uid) != old:
            # capacity on old's node may have freed: what could not be counted there may be
            self._conflicts.retry_on(old.node, self.sync)

    def _count(self, uid: str, assignment: Assignment) -> None:
        """Allocate `assignment` under `uid` (which holds nothing now), or remember why not."""
        if assignment.node in self._h.stale_nodes:
            # The node's inventory changed and is not in the engine yet (at start and after a
            # relist, every node): counting now would fail or count against the old cards, and
            # the flush counts it (it syncs every conflict, and a fresh engine every pod).
            self._conflicts.set(uid, assignment.node, "its node's inventory is not counted yet")
            return
        try:
            self._h.engine.allocate(uid, assignment)
        except (Unschedulable, KeyError, ValueError) as err:
            # An annotation the inventory cannot hold (card gone, node unknown, over capacity):
            # remember it and count it as soon as the inventory allows.
            reason = getattr(err, "reason", str(err))
            self._conflicts.set(uid, assignment.node, reason)
            if not (uid in self._reserved_until and isinstance(err, Unschedulable)
                    and self._hold_part(uid, assignment)):
                # Before every cache has listed, pods often arrive before their node's cards.
                log.log(logging.WARNING if self._h.ready else logging.DEBUG,
                        "pod uid %s: assignment on %s cannot be counted yet: %s",
                        uid, assignment.node, reason)
            return
        self._put_hold(uid, assignment)

    def _hold_part(self, uid: str, reservation: Assignment) -> bool:
        """Hold the part of a defragmentation reservation nobody holds (docs/defrag.md, "The
        reservation": its moved pods still hold the rest); whether any part is held."""
        part = self._h.engine.holdable_part(uid, reservation)
        if part is None:
            return False
        try:
            self._h.engine.allocate(uid, part)
        except (Unschedulable, KeyError, ValueError):
            return False
        self._put_hold(uid, part)
        return True

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

    def sync(self, uid: str) -> None:
        """Make what `uid` holds in the engine what the API says it holds."""
        self._note_distrust(uid)
        if not uid.startswith(EGPU_KEY):
            self._note_reservation(uid)
        desired = self._desired(uid)
        if desired == self._holds.get(uid) and uid not in self._conflicts:
            return
        self.set_hold(uid, desired)

    # ---- counting again after inventory changes (`Inventory.flush`) ---------------------------

    def recount_all(self) -> None:
        """A fresh engine: every hold and reservation counted again."""
        self._usage.push_host()
        self._holds.clear()
        self._egpu_holds.clear()
        self._node_pods.clear()
        for name in self._egpus:  # ElasticGPUs first: a bound claim's cards are its
            self.sync(ledger_key(name))
        for uid in self._pods:
            self.sync(uid)
        for uid, reservations in self._inflight.items():
            for token, reservation in reservations.items():
                self._allocate_reservation(uid, token, reservation.assignment)

    def recount_node(self, name: str) -> None:
        """Re-count the holds on a node updated in the engine: one that came back lost its
        allocations."""
        engine = self._h.engine
        for uid in list(self._node_pods.get(name, ())):
            assignment = self._holds.get(uid)
            if assignment is not None and engine.allocation(uid) != assignment:
                self._drop_hold(uid)
                self.sync(uid)

    def retry_conflicts(self) -> None:
        # ElasticGPUs first: where one and a pod claim the same card, the bound claim wins
        for uid in self._conflicts.every():
            self.sync(uid)

    # ---- pods from the API --------------------------------------------------------------------

    def observe_pod(self, pod: Mapping[str, Any] | PodInfo) -> None:
        """An ADDED/MODIFIED pod from the watch, or a pod a bind read back from the API."""
        info = pod if isinstance(pod, PodInfo) else PodInfo.from_manifest(pod)
        if not info.uid:
            return
        with self._h.lock:
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
            if old is not None and old.counts_as(info) and info.uid not in self._inflight \
                    and info.uid not in self._conflicts:
                # holds, host and shape counts as they are: the record alone is newer
                self._pods[info.uid] = info
                self._waiters.stop_waiting(info.uid)
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
                self.drop_reservations(info.uid)  # bound or done: the truth is known
                self._waiters.stop_waiting(info.uid)
            self.sync(info.uid)
            self._usage.count_host(info.uid, info)
            self._usage.count_shape(info.uid, info)

    def forget_pod(self, uid: str) -> None:
        """The pod is gone (DELETED, or it left the watch's selection by terminating)."""
        with self._h.lock:
            self._index_consumer(uid, self._pods.pop(uid, None), None)
            if uid:
                self._gone[uid] = None
                while len(self._gone) > MAX_GONE:
                    self._gone.popitem(last=False)
            self._waiters.forget(uid)
            self.drop_reservations(uid)
            self.sync(uid)
            self._usage.count_host(uid, None)
            self._usage.count_shape(uid, None)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A relist: exactly these pods exist."""
        infos = [PodInfo.from_manifest(p) for p in pods]
        with self._h.lock:
            fresh = {i.uid for i in infos if i.uid}
            for uid in set(self._pods) - fresh:
                self.forget_pod(uid)
            self._waiters.keep_only(fresh)
            for info in infos:
                # a relist is authoritative, even if its resourceVersion looks older
                self._pods.pop(info.uid, None)
                self.observe_pod(info)

    def pod(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def priority_of(self, uid: str) -> int:
        info = self._pods.get(uid)
        return info.priority if info is not None else 0

    # ---- ElasticGPUs from the API (`ClaimCaches` keeps the claims that name them) -------------

    def elasticgpus(self) -> Mapping[str, claims_model.ElasticGPU]:
        """The ElasticGPUs now (the ledger's own dict: read it under the lock, never change)."""
        return self._egpus

    def put_elasticgpu(self, egpu: claims_model.ElasticGPU, uid: str = "") -> bool:
        """An ElasticGPU from the watch (or the API's answer to our create): it holds its cards
        from now on; any reservation made to create it ends (the truth is known). False if
        nothing changed (or it is a late copy of a deleted one)."""
        if uid and uid in self._egpus_gone:
            return False  # a late copy of a deleted one
        key = ledger_key(egpu.name)
        if self._egpus.get(egpu.name) == egpu and key not in self._inflight:
            return False
        self._egpus[egpu.name] = egpu
        if uid:
            self._egpu_uids[egpu.name] = uid
        self.sync_consumers(egpu.name)  # they give its cards back first
        self.drop_reservations(key)
        self.sync(key)
        return True

    def drop_elasticgpu(self, name: str) -> claims_model.ElasticGPU | None:
        """The ElasticGPU is gone: its cards are freed, or held by the pods still using them."""
        egpu = self._egpus.pop(name, None)
        uid = self._egpu_uids.pop(name, None)
        if uid:
            self._egpus_gone[uid] = None
            while len(self._egpus_gone) > MAX_GONE:
                self._egpus_gone.popitem(last=False)
        self.sync(ledger_key(name))
        self.sync_consumers(name)  # a running pod using its cards holds them now
        return egpu

    # ---- reservations of binds in flight ------------------------------------------------------

    def _reservation_key(self, uid: str, token: int) -> str:
        return f"{uid}#bind{token}"

    def _allocate_reservation(self, uid: str, token: int, assignment: Assignment) -> None:
        self._h.bump()
        try:
            self._h.engine.allocate(self._reservation_key(uid, token), assignment)
        except (Unschedulable, KeyError, ValueError) as err:
            log.warning("reservation of pod uid %s on %s cannot be counted: %s", uid,
                        assignment.node, getattr(err, "reason", err))

    def drop_reservations(self, uid: str, token: int | None = None) -> None:
        self._h.bump()
        reservations = self._inflight.get(uid)
        if not reservations:
            return
        if token is None and not uid.startswith(EGPU_KEY):
            self._hold_from_reservation(uid, reservations)
        for t in [token] if token is not None else list(reservations):
            dropped = reservations.pop(t, None)
            if dropped is not None:
                self._h.engine.release(self._reservation_key(uid, t))
                self._waiters.mark_freed(dropped.assignment.node)
            self._usage.release_host(uid, t)
        if not reservations:
            del self._inflight[uid]
            if uid.startswith(EGPU_KEY):  # if the ElasticGPU was never made, pods naming it
                self.sync_consumers(uid[len(EGPU_KEY):])  # hold its cards themselves
            else:  # a pod whose bind did not land holds its defragmentation reservation again
                self.sync(uid)

    def _hold_from_reservation(self, uid: str, reservations: dict[int, Reservation]) -> None:
        """The pod is bound with the cards one of its bind's reservations holds: that
        allocation becomes its hold as it is (`Engine.rekey`), one engine change where
        releasing it and `sync` allocating the same cards again were two (and marked the node
        freed for nothing); its CPU and memory pass to the bound pod's count. Anything else
        takes the general way."""
        pod = self._pods.get(uid)
        held = pod.held(self._egpu_counted) if pod is not None else None
        if held is None or uid in self._holds or uid in self._conflicts \
                or held.node in self._h.stale_nodes:
            return
        token = next((t for t, r in reservations.items() if r.assignment == held), None)
        if token is None:
            return
        self._h.engine.rekey(self._reservation_key(uid, token), uid)
        del reservations[token]
        self._put_hold(uid, held)
        self._usage.hand_host_to_pod(uid, token)

    @contextmanager
    def defrag_hold_released(self, uid: str) -> Iterator[None]:
        """Binding a pod that holds a defragmentation reservation: its cards are the pod's to
        choose, so the reservation stops counting while the bind's own reservation is made
        (which then holds them); if choosing fails, it counts again."""
        if uid not in self._reserved_until:
            yield
            return
        self.set_hold(uid, None)
        try:
            yield
        finally:
            self.sync(uid)

    def reserve_assignment(self, pod: PodRequest, uid: str, node: str,
                           assignment: Assignment) -> int:
        """Hold the cards chosen for a bind (`Placement.reserve`) under a new token."""
        self._tokens += 1
        token = self._tokens
        self._h.engine.allocate(self._reservation_key(uid, token), assignment)
        self._h.bump()
        self._inflight.setdefault(uid, {})[token] = Reservation(assignment)
        self._waiters.stop_waiting(uid)  # being bound: it waits no more
        if pod.cpu_milli or pod.memory_mib:
            # its CPU and memory count from now, like its cards, until the bind's outcome
            self._usage.reserve_host(uid, token, node, pod.cpu_milli, pod.memory_mib)
        return token

    def reserve_elasticgpu(self, egpu: claims_model.ElasticGPU) -> int:
        """Hold an ElasticGPU's cards under its ledger key until it is created."""
        key = ledger_key(egpu.name)
        assignment = egpu_assignment(egpu)
        self._tokens += 1
        token = self._tokens
        self._h.engine.allocate(self._reservation_key(key, token), assignment)
        self._h.bump()
        self._inflight.setdefault(key, {})[token] = Reservation(assignment)
        return token

    def keep_for_ttl(self, key: str, token: int) -> None:
        """The outcome of the reservation's write is not known: keep it until the TTL."""
        reservation = (self._inflight.get(key) or {}).get(token)
        if reservation is not None:
            reservation.deadline = self._h.clock() + self._h.config.reservation_ttl_s
            self._next_deadline = min(self._next_deadline, reservation.deadline)

    def settle(self, uid: str, token: int, outcome: str,
               pod: Mapping[str, Any] | PodInfo | None = None) -> None:
        """End a bind: `bound` (pass the bound pod, or it is taken from the reservation),
        `failed` (the API refused: nothing was written) or `unknown` (keep for the TTL)."""
        with self._h.lock:
            if outcome == "unknown":
                self.keep_for_ttl(uid, token)
                return
            if outcome == "bound":
                # `pod` is what we know the API holds now (bound, annotated), possibly before
                # the watch says so; a later watch event replaces it, an equal one is ignored.
                # A pod deleted right after its Binding landed can be seen gone before this
                # settles (the worker's reply and the watch event race): it stays gone.
                if pod is not None and uid not in self._gone:
                    info = pod if isinstance(pod, PodInfo) else PodInfo.from_manifest(pod)
                    current = self._pods.get(uid)
                    if current is None or not current.node_name:
                        if current is not None and current.resource_version is not None:
                            info = replace(info, resource_version=max(
                                current.resource_version, info.resource_version or 0))
                        self._index_consumer(uid, current, info)
                        self._pods[uid] = info
                self.drop_reservations(uid)
                self.sync(uid)
                # from the reservation to the bound pod, not the watch
                self._usage.count_host(uid, self._pods.get(uid))
                return
            self.drop_reservations(uid, token)

    def expire(self) -> int:
        """End reservations whose bind outcome stayed unknown past the TTL. Called before
        every verb: it scans the reservations only once the earliest deadline has passed."""
        with self._h.lock:
            late: list[tuple[str, int]] = []
            now = self._h.clock()
            if now >= self._next_deadline:
                late = [(uid, token) for uid, reservations in self._inflight.items()
                        for token, r in reservations.items() if r.deadline <= now]
                for uid, token in late:
                    log.warning("reservation of pod uid %s expired; its bind never showed up",
                                uid)
                    self.drop_reservations(uid, token)
                self._next_deadline = min((r.deadline for rs in self._inflight.values()
                                           for r in rs.values()), default=float("inf"))
            if not self._reserved_until:
                return len(late)
            wall = self._h.wall()
            ended = [uid for uid, until in self._reserved_until.items() if until <= wall]
            for uid in ended:
                log.info("defragmentation reservation of pod uid %s expired", uid)
                self.sync(uid)
            return len(late)

    def reservation_ended(self) -> bool:
        """A defragmentation reservation's expiry passed (`expire` will free its cards)."""
        return min(self._reserved_until.values(), default=float("inf")) <= self._h.wall()

    # ---- reads ----------------------------------------------------------------------------------

    def held(self, uid: str) -> Assignment | None:
        return self._holds.get(uid)

    def holds_view(self) -> Mapping[str, Assignment]:
        """What every key holds (the ledger's own dict: read it under the lock)."""
        return self._holds

    def reserved_node(self, uid: str) -> str | None:
        """The node of the pod's live defragmentation reservation (room was made there)."""
        held = self._holds.get(uid)
        return held.node if held is not None and uid in self._reserved_until else None

    def preemptible_residents(self, node: str) -> dict[str, int]:
        """uid -> priority of the pods holding cards on `node` that kube-scheduler knows as
        victims (a pending pod holding a reservation there is none)."""
        return {u: self._pods[u].priority for u in self._node_pods.get(node, ())
                if u in self._pods and u not in self._reserved_until}

    def holds(self) -> dict[str, Assignment]:
        with self._h.lock:
            return dict(self._holds)

    def inflight(self) -> dict[str, list[Assignment]]:
        with self._h.lock:
            return {uid: [r.assignment for r in rs.values()] for uid, rs in self._inflight.items()}

    def conflicts(self) -> dict[str, str]:
        """uid -> why what it should hold is not (or, a reservation, not all) counted."""
        return dict(self._conflicts.reasons)

    def distrusted(self) -> dict[str, str]:
        """uid -> why the live pod's assignment annotation is not counted."""
        with self._h.lock:
            return dict(self._distrusted)

    def pod_shares(self) -> Iterator[tuple[str, str, Assignment]]:
        """(namespace, pod name, the cards it holds) of every pod whose assignment the ledger
        holds (not binds in flight; ElasticGPUs' are `egpu_holds`): the holds copied under the
        lock at the call (one dict copy: docs/scheduler.md, "two reads for the metrics page"),
        each pod's name read when reached (a pod deleted by then is left out)."""
        with self._h.lock:
            holds = dict(self._holds)
        return self._named(holds)

    def _named(self, holds: dict[str, Assignment]) -> Iterator[tuple[str, str, Assignment]]:
        pods = self._pods
        for uid, assignment in holds.items():
            pod = pods.get(uid)  # one dict read: atomic without the lock
            if pod is not None:
                yield pod.namespace, pod.name, assignment

    def egpu_holds(self) -> dict[str, Assignment]:
        """ElasticGPU name -> the cards it holds in the engine."""
        with self._h.lock:
            return dict(self._egpu_holds)
