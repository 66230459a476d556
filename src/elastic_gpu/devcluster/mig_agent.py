"""The sandbox's stand-in for the agents' MIG applier on kwok nodes (dynamic MIG, issue 42).

kwok nodes have no agent; for the nodes labelled `elasticgpu.io/mig-dynamic=true` the
sandbox's `allocation-sync` runs, each pass, what their agents would (the MigLayouts of every
node read from one watch, `MigAgents.start`: `agent.miglayout.LayoutCache`, not a LIST per
node and pass):
`agent.miglayout.MigApplier` over a fake backend, which carries out each MigLayout step by
step (fence, settle, destroy, create, unfence) and then publishes the node's GPUDevices and
capacity through the agent's own `publish_node`.

The fake card's layout lives in the GPUDevices: a restarted stand-in builds each node's fake
backend from the cards as last published, as an agent restarted on a real node reads the
layout the GPU kept. A step's change is published before its status is written, so a process
SIGKILLed at any point leaves GPUDevices that are the card's real layout (the fake backend has
no other memory), and the next one carries on from there.

A DRA-mode kwok node (`gpuMode: dra`) is served as its DRA agent would
(`agent.dra.miglayout`): the holders are the allocated ResourceClaims, the fence is the
card's devices' taint in the slices. Its fake card's layout and fence live in the Node's
annotations (`devcluster.dra_nodes`: `FAKE_INVENTORY_ANNOTATION`, `FAKE_FENCE_ANNOTATION`,
written first), from which the slices are then published (`fake_node_cards`), so a stand-in
killed between the two leaves the annotation that allocation-sync's slice sync publishes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.deviceplugin.publish import publish_node
from elastic_gpu.agent.dra.miglayout import claim_holders
from elastic_gpu.agent.dra.slices_api import publish_node_slices
from elastic_gpu.agent.miglayout import LayoutCache, MigApplier
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.dra.nodemode import is_dra_node, node_object_labels
from elastic_gpu.core.mig.apply import Step
from elastic_gpu.core.model import Card, Health
from elastic_gpu.devcluster.dra_nodes import (
    FAKE_FENCE_ANNOTATION,
    FAKE_INVENTORY_ANNOTATION,
    cards_from_json,
    fake_node_cards,
    inventory_json,
)
from elastic_gpu.devcluster.nodes import FAKE_NODE_AGENT_CONFIG, FAKE_NODE_LABEL
from elastic_gpu.kube.resources import GPUDEVICES, NODES
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)


def fake_backend(client: SyncKubeClient, node: str) -> FakeBackend | None:
    """The node's fake backend, its cards as their GPUDevices last published them (a fence is
    not a health: the fake card is healthy under it); None: no GPUDevice yet."""
    objs, _ = client.list(GPUDEVICES.path(), {"labelSelector": f"{gd.NODE_LABEL}={node}"})
    nodes = gd.nodes_from_objects(objs)
    if not nodes:
        return None
    cards = [replace(c, health=Health.HEALTHY if c.health is Health.FENCED else c.health,
                     mig=tuple(replace(m, health=Health.HEALTHY) for m in c.mig),
                     offers=None, usage=None)
             for c in nodes[0].cards]
    return FakeBackend.from_cards(cards, node)


def _annotations(client: SyncKubeClient, node: str) -> Mapping[str, Any]:
    meta = client.get(NODES.path(name=node)).get("metadata") or {}
    return meta.get("annotations") or {}


@dataclass
class FakeDraNode:
    """A DRA-mode kwok node as its stand-in agent keeps it: the fake card's layout and the
    fence in the Node's annotations, published as its ResourceSlices (with the fence taint)."""

    client: SyncKubeClient
    node: str
    backend: FakeBackend

    def _write(self, annotations: Mapping[str, str]) -> None:
        self.client.patch(NODES.path(name=self.node), {"metadata": {"annotations": annotations}})
        now = _annotations(self.client, self.node)
        uid = str(self.client.get(NODES.path(name=self.node))["metadata"]["uid"])
        publish_node_slices(self.client, self.node, list(fake_node_cards(now)), uid)

    def published(self) -> None:
        """A step changed the card: the fake inventory is the backend's cards now."""
        self._write({FAKE_INVENTORY_ANNOTATION: inventory_json(self.node,
                                                               self.backend.discover())})

    # agent.miglayout.CardFence
    def fenced(self, cards: Sequence[Card]) -> set[str]:
        raw = json.loads(_annotations(self.client, self.node).get(FAKE_FENCE_ANNOTATION) or "[]")
        return {str(u) for u in raw} & {c.uuid for c in cards}

    def set(self, card: Card, reason: str | None) -> None:
        raw = json.loads(_annotations(self.client, self.node).get(FAKE_FENCE_ANNOTATION) or "[]")
        fenced = {str(u) for u in raw}
        fenced = fenced - {card.uuid} if reason is None else fenced | {card.uuid}
        self._write({FAKE_FENCE_ANNOTATION: json.dumps(sorted(fenced))})


def fake_dra_applier(client: SyncKubeClient, node: Mapping[str, Any],
                     after_step: Callable[[Step], None],
                     cache: LayoutCache | None = None) -> MigApplier | None:
    """The stand-in applier of a DRA-mode kwok node (None: no fake inventory)."""
    meta = node.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(FAKE_INVENTORY_ANNOTATION)
    if not text:
        return None
    name = str(meta["name"])
    cards = [replace(c, offers=None, usage=None) for c in cards_from_json(text)]
    fake = FakeDraNode(client, name, FakeBackend.from_cards(cards, name))
    return MigApplier(client, name, fake.backend, fake.published, after_step=after_step,
                      fence=fake, held=claim_holders(client, name), cache=cache)


class MigAgents:
    """One applier per kwok node opted in to dynamic MIG, found anew each pass; after `start`
    they read their MigLayouts from one watch of every node's (before it, or until its first
    list is in, each lists its own)."""

    def __init__(self, client: SyncKubeClient,
                 after_step: Callable[[Step], None] = lambda step: None) -> None:
        self.client = client
        self.after_step = after_step
        self.appliers: dict[str, MigApplier] = {}
        self.cache: LayoutCache | None = None

    def start(self) -> None:
        """Watch every node's MigLayouts (one informer in the client's loop)."""
        self.cache = LayoutCache(self.client, None)
        self.cache.start()
        for applier in self.appliers.values():
            applier.cache = self.cache

    def close(self) -> None:
        if self.cache is not None:
            self.cache.stop()

    def _applier(self, node: str, obj: Mapping[str, Any]) -> MigApplier | None:
        if node not in self.appliers and is_dra_node(node_object_labels(obj)):
            applier = fake_dra_applier(self.client, obj, self.after_step, self.cache)
            if applier is None:
                return None
            self.appliers[node] = applier
        if node not in self.appliers:
            backend = fake_backend(self.client, node)
            if backend is None:
                return None

            def published(node: str = node, backend: FakeBackend = backend) -> None:
                publish_node(self.client, backend, FAKE_NODE_AGENT_CONFIG, node)

            self.appliers[node] = MigApplier(self.client, node, backend, published,
                                             after_step=self.after_step, cache=self.cache)
        return self.appliers[node]

    def sync(self) -> None:
        nodes, _ = self.client.list(NODES.path(), {
            "labelSelector": f"{MIG_DYNAMIC_LABEL}=true,{FAKE_NODE_LABEL}=true"})
        for obj in nodes:
            name = str((obj.get("metadata") or {}).get("name"))
            try:
                applier = self._applier(name, obj)
                if applier is not None:
                    applier.round()
            except Exception:
                log.exception("MIG layouts of %s", name)
