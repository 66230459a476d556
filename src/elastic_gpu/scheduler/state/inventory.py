"""Nodes and their GPUDevice cards as the watches show them, pushed into the engine in batches.

A change marks its node stale (`StateHandle.stale_nodes`); `flush` (run before every
decision) rebuilds the engine once for many changes (a relist) or updates the changed nodes one
by one, then has the ledger count again the holds and reservations the change touched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from elastic_gpu.core.dra.nodemode import is_dra_node
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.nodeaffinity import Taint
from elastic_gpu.scheduler.narrowing import PREFER_NO_SCHEDULE
from elastic_gpu.scheduler.state.handle import StateHandle
from elastic_gpu.scheduler.state.records import NodeInfo

log = logging.getLogger(__name__)


class Recount(Protocol):
    """What the inventory asks of the ledger (`Ledger`) when the engine's nodes change."""

    def recount_all(self) -> None: ...

    def recount_node(self, name: str) -> None: ...

    def retry_conflicts(self) -> None: ...


class Freeing(Protocol):
    """What the inventory tells the pods waiting for capacity (`Wakeups`)."""

    def mark_freed(self, node: str) -> None: ...


class Inventory:
    """Nodes and cards: the engine's inventory."""

    def __init__(self, handle: StateHandle, ledger: Recount, freeing: Freeing) -> None:
        self._h = handle
        self._ledger = ledger
        self._freeing = freeing
        self._nodes: dict[str, NodeInfo] = {}
        self._devices: dict[str, tuple[str, Card]] = {}  # device object name -> (node, card)
        self._node_devices: dict[str, set[str]] = {}
        #: nodes serving GPUs through DRA (`core.dra.nodemode`): kube-scheduler allocates
        #: their devices; the engine never sees cards there
        self._dra_nodes: set[str] = set()
        #: nodes with a PreferNoSchedule taint, and those taints (`filterResult: auto` gives
        #: a pod every fitting node when one of them does not tolerate it: `narrowing`)
        self._prefer_no_schedule: dict[str, tuple[Taint, ...]] = {}

    def upsert_node(self, info: NodeInfo) -> None:
        with self._h.lock:
            if self._nodes.get(info.name) != info:
                self._nodes[info.name] = info
                self._h.stale_nodes.add(info.name)
                if is_dra_node(info.labels):
                    self._dra_nodes.add(info.name)
                else:
                    self._dra_nodes.discard(info.name)
                soft = tuple(t for t in info.taints if t.effect == PREFER_NO_SCHEDULE)
                if soft:
                    self._prefer_no_schedule[info.name] = soft
                else:
                    self._prefer_no_schedule.pop(info.name, None)

    def remove_node(self, name: str) -> None:
        with self._h.lock:
            if self._nodes.pop(name, None) is not None:
                self._h.stale_nodes.add(name)
                self._dra_nodes.discard(name)
                self._prefer_no_schedule.pop(name, None)

    def replace_nodes(self, infos: Iterable[NodeInfo]) -> None:
        """A relist: exactly these nodes exist."""
        with self._h.lock:
            fresh = {i.name: i for i in infos}
            for name in set(self._nodes) - set(fresh):
                self.remove_node(name)
            for info in fresh.values():
                self.upsert_node(info)

    def upsert_device(self, object_name: str, node: str, card: Card) -> None:
        with self._h.lock:
            old = self._devices.get(object_name)
            if old == (node, card):
                return
            if old is not None and old[0] != node:
                self._node_devices.get(old[0], set()).discard(object_name)
                self._h.stale_nodes.add(old[0])
            self._devices[object_name] = (node, card)
            self._node_devices.setdefault(node, set()).add(object_name)
            self._h.stale_nodes.add(node)

    def remove_device(self, object_name: str) -> None:
        with self._h.lock:
            old = self._devices.pop(object_name, None)
            if old is not None:
                self._node_devices.get(old[0], set()).discard(object_name)
                self._h.stale_nodes.add(old[0])

    def replace_devices(self, devices: Iterable[tuple[str, str, Card]]) -> None:
        with self._h.lock:
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

    def prefer_no_schedule(self) -> dict[str, tuple[Taint, ...]]:
        """The nodes with a PreferNoSchedule taint, and those taints (a copy; usually empty)."""
        with self._h.lock:
            return dict(self._prefer_no_schedule) if self._prefer_no_schedule else {}

    def known_nodes(self) -> frozenset[str]:
        """Nodes the engine knows (with their inventory), as of the last flush."""
        return self._h.known

    def flush(self) -> None:
        """Push changed nodes into the engine (batched: a relist rebuilds once)."""
        if not self._h.stale_nodes:
            return
        try:
            self._apply_dirty()
        finally:
            self._h.known = frozenset(self._h.engine.nodes())

    def _apply_dirty(self) -> None:
        h = self._h
        h.bump()
        dirty, h.stale_nodes = h.stale_nodes, set()
        for name in dirty:  # a node added, or its cards changed: it may have grown
            self._freeing.mark_freed(name)
        known = set(h.engine.nodes())
        if len(dirty) > 64 and len(dirty) * 4 > len(known):
            # Many nodes changed (startup, relist): a fresh engine from all nodes, then every
            # hold again, is cheaper than thousands of single updates.
            nodes = [n for n in (self._model_node(name) for name in sorted(self._nodes)) if n]
            h.engine = h.new_engine(nodes)
            self._ledger.recount_all()
            return
        for name in sorted(dirty):
            node = self._model_node(name)
            if node is None:
                if name in known:
                    h.engine.remove_node(name)
                continue
            h.engine.upsert_node(node)
            self._ledger.recount_node(name)
        self._ledger.retry_conflicts()
