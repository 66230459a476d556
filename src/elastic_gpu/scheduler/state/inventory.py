"""Nodes and their GPUDevice cards as the watches show them, pushed into the engine in batches.

A change marks its node dirty; `_flush` (run before every decision) rebuilds the engine once
for many changes (a relist) or updates the changed nodes one by one, then counts again the
holds and reservations the change touched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from elastic_gpu.core.claims.inventory import ledger_key
from elastic_gpu.core.dra.nodemode import is_dra_node
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.state.base import EGPU_KEY, StateBase
from elastic_gpu.scheduler.state.records import NodeInfo

log = logging.getLogger(__name__)


class Inventory(StateBase):
    """Nodes and cards: the engine's inventory."""

    def upsert_node(self, info: NodeInfo) -> None:
        with self._lock:
            if self._nodes.get(info.name) != info:
                self._nodes[info.name] = info
                self._dirty.add(info.name)
                if is_dra_node(info.labels):
                    self._dra_nodes.add(info.name)
                else:
                    self._dra_nodes.discard(info.name)

    def remove_node(self, name: str) -> None:
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._dirty.add(name)
                self._dra_nodes.discard(name)

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

    def dra_nodes(self, names: Iterable[str]) -> set[str]:
        """Those of `names` that serve GPUs through DRA (their Node's label says so)."""
        dra = self._dra_nodes
        return {n for n in names if n in dra} if dra else set()

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
