"""Dynamic MIG on a DRA node: what the applier (`agent.miglayout.MigApplier`) needs of this mode.

The applier and its step decision are the device-plugin path's; a DRA node differs in two
facts:

- **who holds a card**: the allocated ResourceClaims whose devices are on the node
  (`claim_holders`, read with `core.dra.sliceview.claim_holds`: a claim on a card device holds
  the card, a claim on a MIG device holds that instance), whoever allocated them;
- **where the fence is**: the card's devices stay in the slice with the NoSchedule taint
  `gpu.elasticgpu.io/fenced` (`core.dra.devices.FENCE_TAINT`, device taints, beta and on by
  default in 1.36), rather than left out of it. A claim already allocated keeps its device (a
  device left out would read as gone to kube-scheduler and to the kubelet plugin's prepare);
  no new claim is given one, by kube-scheduler or by our allocator (which reads the taint as
  `Health.FENCED`). `SliceFence` keeps the fenced cards, republishes the slices with them
  tainted, and on a restart reads the fence back from the slices' taints, so a fence is never
  lost with the process that set it.

After each step the mode republishes the node's slices from the backend's cards
(`DraNode.layout_changed`): a carved card's partitionable MIG devices and its counter set, a
merged card's one card device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from elastic_gpu.agent.dra.slices_api import existing_slices
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.dra.inventory import claim_key
from elastic_gpu.core.dra.sliceview import claim_holds, node_cards
from elastic_gpu.core.model import Card, Health
from elastic_gpu.kube.resources import RESOURCE_CLAIMS
from elastic_gpu.kube.sync import SyncKubeClient


def claim_holders(client: SyncKubeClient, node: str
                  ) -> Callable[[Sequence[Card]], list[tuple[str, Assignment]]]:
    """The applier's `held` on a DRA node: what allocated ResourceClaims hold of `cards`."""

    def held(cards: Sequence[Card]) -> list[tuple[str, Assignment]]:
        claims, _ = client.list(RESOURCE_CLAIMS.path())
        holds, _ = claim_holds(claims, {node: list(cards)})
        return [(claim_key(h.namespace, h.name), Assignment(node, {"claim": h.shares}))
                for h in holds]

    return held


def fenced_in_slices(client: SyncKubeClient, node: str) -> set[str]:
    """The card uuids whose devices carry the fence taint in the node's published slices."""
    cards = node_cards(existing_slices(client, node)).get(node, [])
    return {c.uuid for c in cards if c.health is Health.FENCED}


def with_fences(cards: Sequence[Card], fenced: set[str] | frozenset[str]) -> list[Card]:
    """`cards` as published: a fenced healthy card is `Health.FENCED` (its devices tainted);
    an unhealthy card stays unhealthy."""
    return [replace(c, health=Health.FENCED) if c.uuid in fenced and c.health is Health.HEALTHY
            else c for c in cards]


@dataclass
class SliceFence:
    """The fence of a DRA node's cards (`agent.miglayout.CardFence`): kept here, published as
    the devices' taint by `publish` (which reads `current()`)."""

    client: SyncKubeClient
    node: str
    publish: Callable[[], object]
    _fenced: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def current(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._fenced)

    def load(self) -> None:
        """Read the fence back from the published slices (at start, before the mode first
        publishes: an agent restarted mid-change keeps its cards fenced)."""
        found = fenced_in_slices(self.client, self.node)
        with self._lock:
            self._fenced |= found

    def fenced(self, cards: Sequence[Card]) -> set[str]:
        return set(self.current() & {c.uuid for c in cards})

    def set(self, card: Card, reason: str | None) -> None:
        with self._lock:
            if reason is None:
                self._fenced.discard(card.uuid)
            else:
                self._fenced.add(card.uuid)
        self.publish()
