"""The sandbox's stand-in for the agents' MIG applier on kwok nodes (dynamic MIG, issue 42).

kwok nodes have no agent; for the nodes labelled `elasticgpu.io/mig-dynamic=true` the
sandbox's `allocation-sync` runs, each pass, what their agents would:
`agent.miglayout.MigApplier` over a fake backend, which carries out each MigLayout step by
step (fence, settle, destroy, create, unfence) and then publishes the node's GPUDevices and
capacity through the agent's own `publish_node`.

The fake card's layout lives in the GPUDevices: a restarted stand-in builds each node's fake
backend from the cards as last published, as an agent restarted on a real node reads the
layout the GPU kept. A step's change is published before its status is written, so a process
SIGKILLed at any point leaves GPUDevices that are the card's real layout (the fake backend has
no other memory), and the next one carries on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.deviceplugin.publish import publish_node
from elastic_gpu.agent.miglayout import MigApplier
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.mig.apply import Step
from elastic_gpu.core.model import Health
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


class MigAgents:
    """One applier per kwok node opted in to dynamic MIG, found anew each pass."""

    def __init__(self, client: SyncKubeClient,
                 after_step: Callable[[Step], None] = lambda step: None) -> None:
        self.client = client
        self.after_step = after_step
        self.appliers: dict[str, MigApplier] = {}

    def _applier(self, node: str) -> MigApplier | None:
        if node not in self.appliers:
            backend = fake_backend(self.client, node)
            if backend is None:
                return None

            def published(node: str = node, backend: FakeBackend = backend) -> None:
                publish_node(self.client, backend, FAKE_NODE_AGENT_CONFIG, node)

            self.appliers[node] = MigApplier(self.client, node, backend, published,
                                             after_step=self.after_step)
        return self.appliers[node]

    def sync(self) -> None:
        nodes, _ = self.client.list(NODES.path(), {
            "labelSelector": f"{MIG_DYNAMIC_LABEL}=true,{FAKE_NODE_LABEL}=true"})
        for obj in nodes:
            name = str((obj.get("metadata") or {}).get("name"))
            try:
                applier = self._applier(name)
                if applier is not None:
                    applier.round()
            except Exception:
                log.exception("MIG layouts of %s", name)
