"""What the extender knows: inventory, every pod's hold on cards, and binds in flight.

The API server is the source of truth. A bound pod *holds* the cards its assignment
annotation names (written atomically with its Binding, see `binder.Binder.bind`); the engine's
allocations are derived from those annotations plus the reservations of binds whose outcome
is not known yet, so a restarted scheduler that lists pods arrives at the same allocations.

Concurrency: every method runs to completion without awaiting and takes `_lock`, so engine
mutations are serialized and a filter or bind always sees every earlier reservation. Holds are
keyed by pod UID: a pod deleted and re-created under the same name is a different pod.

ElasticGPUs (issue #15, docs/claims.md): every ElasticGPU with a node and cards holds them in
the engine under `core.claims.ledger_key(name)`, whatever its phase, until it is deleted; the
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

The state is a package of parts over one base (`base.StateBase`: the fields and the lock):
`inventory` (nodes, cards), `holds` (pods, ElasticGPUs, the ledger), `claims` (the Elastic GPU
API), `reservations` (binds in flight), `wakeups` (pending pods), `placement` (filter,
prioritize, preempt). `SchedulerState` below is all of them, plus the read-only views.
"""

from __future__ import annotations

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Card
from elastic_gpu.scheduler.state.claims import ClaimCaches
from elastic_gpu.scheduler.state.holds import Holds
from elastic_gpu.scheduler.state.inventory import Inventory
from elastic_gpu.scheduler.state.placement import Placement
from elastic_gpu.scheduler.state.records import NodeInfo, PodInfo, StateNotReady
from elastic_gpu.scheduler.state.reservations import Reservations
from elastic_gpu.scheduler.state.wakeups import Wakeups

__all__ = ["NodeInfo", "PodInfo", "SchedulerState", "StateNotReady"]


class SchedulerState(Inventory, Holds, ClaimCaches, Reservations, Wakeups, Placement):
    """What the extender knows (the module's docstring): every part over one set of fields
    and one lock."""

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
