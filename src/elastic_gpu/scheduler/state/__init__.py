"""What the extender knows: inventory, every pod's hold on cards, and binds in flight.

The API server is the source of truth. A bound pod *holds* the cards its assignment
annotation names (written atomically with its Binding, see `binder.Binder.bind`); the engine's
allocations are derived from those annotations plus the reservations of binds whose outcome
is not known yet, so a restarted scheduler that lists pods arrives at the same allocations.

Concurrency: one `RLock` (`StateHandle.lock`) for every part. Every public method runs to
completion without awaiting and takes it, so engine mutations are serialized and a filter or
bind always sees every earlier reservation. Holds are keyed by pod UID: a pod deleted and
re-created under the same name is a different pod.

ElasticGPUs (issue #15, docs/claims.md): every ElasticGPU with a node and cards holds them in
the engine under `core.claims.ledger_key(name)`, whatever its phase, until it is deleted; the
holds live in the same ledger as pods' (keyed by ledger key instead of pod UID), so relists,
inventory changes and conflicts treat both alike. A pod consuming a claim carries an
assignment whose claim-backed containers are marked (`Assignment.claims`): only its other
containers are held under its UID (`Assignment.unclaimed`). Provisioning (`reserve_elasticgpu`)
reserves an ElasticGPU's cards under its ledger key before it is created, like a bind.

Reservations: `reserve` allocates before the Binding is sent, under its own engine key, so a
pod can have several (a retry while an earlier attempt's outcome is unknown). `settle` ends
one: bound (the annotation holds the cards from then on), failed (the API refused: freed), or
unknown (a timeout: kept until `reservationTTLSeconds`, longer than any request can take to
land). Seeing the pod bound in the API ends all of its reservations: the truth is known.

The state is objects, each with its own fields, joined by a `handle.StateHandle` (config,
clocks, the lock, the engine, the version, readiness), as kube-scheduler keeps its cache, queue
and plugins apart: `wakeups.Wakeups` (pending pods; calls no part), `usage.PodUsage` (pods' CPU,
memory and shapes), `ledger.Ledger` (pods, ElasticGPUs, what they hold, binds in flight),
`inventory.Inventory` (nodes, cards), `placement.Placement` (filter, prioritize, preempt, the
cards of a bind), `claims.ClaimCaches` (claims, classes, their verbs). Each is built from the
ones it calls, in that order, typed by a small Protocol in its own file (the seam: what it asks
of the other). `SchedulerState` below builds them and is the one front callers use: its public
names are the parts' methods, plus the views that read several parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from elastic_gpu.core.model import Card
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.placement.cardtable import CardTable
from elastic_gpu.core.wakeup import Wake
from elastic_gpu.core.workload import TargetWorkload
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state.claims import ClaimCaches
from elastic_gpu.scheduler.state.handle import StateHandle
from elastic_gpu.scheduler.state.inventory import Inventory
from elastic_gpu.scheduler.state.ledger import Ledger
from elastic_gpu.scheduler.state.placement import Placement
from elastic_gpu.scheduler.state.records import NodeInfo, PodInfo, StateNotReady
from elastic_gpu.scheduler.state.usage import PodUsage
from elastic_gpu.scheduler.state.wakeups import Wakeups

__all__ = ["NodeInfo", "PodInfo", "SchedulerState", "StateNotReady"]


class SchedulerState:
    """What the extender knows (the module's docstring): the parts, built and joined, behind
    one front. The public names are bound to the part that answers them."""

    def __init__(self, config: SchedulerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        h = self._handle = StateHandle(config, clock, wall_clock)
        wakeups = self._wakeups = Wakeups(h)
        usage = self._usage = PodUsage(h)
        ledger = self._ledger = Ledger(h, usage, wakeups)
        inventory = self._inventory = Inventory(h, ledger, wakeups)
        placement = Placement(h, inventory, ledger, usage, wakeups)
        claims = ClaimCaches(h, placement, ledger, wakeups)

        self.require_ready = h.require_ready
        self.not_ready_reason = h.not_ready_reason

        self.upsert_node = inventory.upsert_node
        self.remove_node = inventory.remove_node
        self.replace_nodes = inventory.replace_nodes
        self.upsert_device = inventory.upsert_device
        self.remove_device = inventory.remove_device
        self.replace_devices = inventory.replace_devices
        self.node = inventory.node
        self.dra_nodes = inventory.dra_nodes
        self.prefer_no_schedule = inventory.prefer_no_schedule
        self.known_nodes = inventory.known_nodes

        self.observe_pod = ledger.observe_pod
        self.forget_pod = ledger.forget_pod
        self.replace_pods = ledger.replace_pods
        self.pod = ledger.pod
        self.settle = ledger.settle
        self.expire = ledger.expire
        self.holds = ledger.holds
        self.inflight = ledger.inflight
        self.conflicts = ledger.conflicts
        self.distrusted = ledger.distrusted
        self.pod_shares = ledger.pod_shares
        self.egpu_holds = ledger.egpu_holds

        self.filter = placement.filter
        self.prioritize = placement.prioritize
        self.preempt = placement.preempt
        self.reserve = placement.reserve

        self.upsert_elasticgpu = claims.upsert_elasticgpu
        self.remove_elasticgpu = claims.remove_elasticgpu
        self.replace_elasticgpus = claims.replace_elasticgpus
        self.upsert_claim = claims.upsert_claim
        self.remove_claim = claims.remove_claim
        self.replace_claims = claims.replace_claims
        self.upsert_class = claims.upsert_class
        self.remove_class = claims.remove_class
        self.replace_classes = claims.replace_classes
        self.claim = claims.claim
        self.elasticgpu = claims.elasticgpu
        self.elasticgpus = claims.elasticgpus
        self.classes = claims.classes
        self.claim_view = claims.claim_view
        self.filter_claims = claims.filter_claims
        self.reserve_claims = claims.reserve_claims
        self.provision = claims.provision
        self.settle_elasticgpu = claims.settle_elasticgpu

        self.wakeup_done = wakeups.wakeup_done
        self.waiting = wakeups.waiting
        self.wakeup_stats = wakeups.wakeup_stats

    # ---- the handle's facts -------------------------------------------------------------------

    @property
    def config(self) -> SchedulerConfig:
        return self._handle.config

    @property
    def engine(self) -> Engine:
        """The engine now (a relist replaces it: read it again, never keep it)."""
        return self._handle.engine

    @property
    def workload(self) -> TargetWorkload | None:
        """The engine's target workload (None: the built-in default)."""
        return self._handle.workload

    @property
    def required_sources(self) -> frozenset[str]:
        return self._handle.required_sources

    @property
    def ready(self) -> bool:
        return self._handle.ready

    def mark_synced(self, source: str) -> None:
        with self._handle.lock:
            self._handle.synced.add(source)
            self._inventory.flush()

    # ---- across parts -------------------------------------------------------------------------

    def wakeups(self, check_limit: int = 64, wake_limit: int = 32) -> list[Wake]:
        """`Wakeups.wakeups`, with the engine brought up to date first."""
        return self._wakeups.wakeups(self._catch_up, check_limit, wake_limit,
                                     self._ledger.reserved_node)

    def _catch_up(self) -> None:
        self._inventory.flush()  # inventory changes are marked freed as they reach the engine
        self._ledger.expire()

    def wakeup_pending(self) -> bool:
        """`Wakeups.pending`: a hint, read without the lock."""
        return self._wakeups.pending(self._ledger.reservation_ended)

    def card_usage(self) -> CardTable:
        """node -> [(card index, milli-cards, MiB allocated)], as of now; each node's list is
        made when it is read (`core.placement.cardtable`: the lock is held for two array
        copies, not for a list per node)."""
        with self._handle.lock:
            self._inventory.flush()
            return self._handle.engine.card_table()

    def cards(self) -> dict[str, tuple[Card, ...]]:
        """Each known node's cards as the engine has them (uuid, model, health, capacity)."""
        with self._handle.lock:
            self._inventory.flush()
            engine = self._handle.engine
            return {name: engine.node(name).cards for name in engine.nodes()}

    def host_usage(self) -> dict[str, tuple[int, int]]:
        """(CPU milli, memory MiB) that the bound pods of each known node ask for."""
        with self._handle.lock:
            self._inventory.flush()
            return {name: self._usage.host_total(name) for name in self._handle.engine.nodes()}

    def workload_size(self) -> tuple[int, int]:
        """(live pods counted for the observed workload, shapes of the workload in use)."""
        with self._handle.lock:
            return self._usage.workload_size()

    def node_names(self) -> list[str]:
        with self._handle.lock:
            self._inventory.flush()
            return self._handle.engine.nodes()

