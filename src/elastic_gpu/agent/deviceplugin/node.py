"""The device-plugin node mode (`agent.nodemode`): the node's cards as GPUDevice objects for
the scheduler extender, its capacity in the Node's status, one kubelet device plugin per
advertised resource (`manager.PluginManager`), Allocate served by `allocator.Allocator`."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elastic_gpu.agent.accounting import CardUse, card_usage
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.deviceplugin.inventory_api import (
    publish_allocations,
    publish_health,
    publish_inventory,
    require_crd,
)
from elastic_gpu.agent.deviceplugin.manager import PluginManager
from elastic_gpu.agent.deviceplugin.plugin import PluginServer
from elastic_gpu.agent.deviceplugin.publish import publish_snapshot
from elastic_gpu.agent.node_status import patch_node_capacity
from elastic_gpu.agent.nodemode import NodeModeError
from elastic_gpu.agent.pods import PodSource
from elastic_gpu.agent.snapshot import NodeSnapshot
from elastic_gpu.agent.state import NodeState
from elastic_gpu.agent.usage.sinks import ApiSinks
from elastic_gpu.core.dra.nodemode import (
    GPU_MODE_DRA,
    GPU_MODE_LABEL,
    is_dra_node,
    node_object_labels,
)
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)


def device_plugin_refusal(node: Mapping[str, Any], name: str) -> str | None:
    """Why a device-plugin agent (no `dra.enabled`) must not start on the Node (None: it may):
    the node is in the DRA node group. Its cards would be published as GPUDevices for the
    extender too, and one card handed out twice (the mirror of `dra.node.mode_refusal`: each
    agent refuses the other's node, so a node labelled for both groups runs neither)."""
    if not is_dra_node(node_object_labels(node)):
        return None
    return (f"Node {name} has {GPU_MODE_LABEL}={GPU_MODE_DRA}: it is in the DRA node group, "
            "whose agent runs with dra.enabled (docs/dra.md); a device-plugin agent there would "
            "publish its cards to the scheduler extender as well, and kube-scheduler's DRA "
            "allocator and the extender would hand the same card out twice. Remove the label, "
            "or run this agent with dra.enabled")


class DevicePluginNode:
    """`current` is the node's snapshot as the cards are now, `reasons` per card why it is
    unhealthy (the GPUDevice's reason); without `client` (`--no-api`) only the plugins run."""

    def __init__(self, config: AgentConfig, node: str, client: SyncKubeClient | None,
                 state: NodeState, allocator: Allocator, plugin_dir: Path,
                 current: Callable[[], NodeSnapshot], reasons: Callable[[], dict[int, str]],
                 pods: PodSource | None) -> None:
        self.config = config
        self.node = node
        self.client = client
        self.allocator = allocator
        self.current = current
        self.reasons = reasons
        self.pods = pods
        self.state = state
        self.plugin_dir = plugin_dir
        self.manager = self._plugins()
        self._sinks: ApiSinks | None = None
        #: The uid of the Node the GPUDevices were last published under (their owner).
        self._owner_uid: str | None = None

    def _servers(self) -> list[PluginServer]:
        return [PluginServer(plan, self.state, self.allocator, self.plugin_dir)
                for plan in self.current().plans]

    def _plugins(self) -> PluginManager:
        return PluginManager(self._servers(), self.plugin_dir)

    @property
    def applies_mig_layouts(self) -> bool:
        return True

    def mig_seam(self) -> tuple[None, None]:
        return None, None  # the applier's defaults: GPUDevices' fence, pods' assignments

    def layout_changed(self) -> None:
        """Serve the plugins of the resources the cards back now (a carved card backs
        `nvidia.com/mig-*`, no longer `nvidia.com/gpu`): only those whose devices changed are
        served and registered again (`PluginManager.update`); then the GPUDevices' spec (their
        instances) and the Node's capacity."""
        restarted = self.manager.update(self._servers())
        log.info("MIG layout changed: device plugins re-served: %s", restarted or "none")
        if self.client is not None:
            snap = self.current()
            publish_inventory(self.client, snap.node, self.reasons(), self._owner_uid)
            patch_node_capacity(self.client, self.node, snap.capacity, snap.allocatable,
                                self.config)

    def capacity(self) -> tuple[Mapping[str, str], Mapping[str, str]]:
        snap = self.current()
        return snap.capacity, snap.allocatable

    def start(self) -> None:
        if self.client is None:
            return
        refusal = device_plugin_refusal(self.client.get(NODES.path(name=self.node)), self.node)
        if refusal is not None:
            raise NodeModeError(refusal)
        # The CRD comes from deploy/crds at install time; the agent may not write CRDs.
        require_crd(self.client)
        self._owner_uid = publish_snapshot(self.client, self.current(), self.config,
                                           self.reasons())

    def _republish(self, why: str, node_uid: str | None = None) -> None:
        """Write every GPUDevice again, owned by the Node as it is now: one was deleted (the
        garbage collector removes those an earlier Node of the same name owned), or the Node
        was recreated under a new uid."""
        assert self.client is not None
        log.warning("republishing the GPUDevices of %s: %s", self.node, why)
        if node_uid is None:
            self._owner_uid = publish_snapshot(self.client, self.current(), self.config,
                                               self.reasons())
        else:
            publish_inventory(self.client, self.current().node, self.reasons(), node_uid)
            self._owner_uid = node_uid

    def serve(self) -> None:
        self.manager.start()

    def cards_changed(self) -> None:
        if self.client is None:
            return
        snap = self.current()
        missing = publish_health(self.client, snap.node, self.reasons())
        patch_node_capacity(self.client, self.node, snap.capacity, snap.allocatable,
                            self.config)
        if missing:
            self._republish(f"the GPUDevices of cards {missing} are gone")

    def reasons_changed(self) -> None:
        if self.client is not None:
            missing = publish_health(self.client, self.current().node, self.reasons())
            if missing:
                self._republish(f"the GPUDevices of cards {missing} are gone")

    def sync(self) -> dict[int, CardUse]:
        """Allocation columns, holders and heartbeat of the GPUDevices (pods from the watch
        cache once it has synced); re-assert the Node's GPU capacity, and the GPUDevices
        themselves when the Node has a new uid or one of them is gone."""
        assert self.client is not None and self.pods is not None
        snap = self.current()
        uid = patch_node_capacity(self.client, self.node, snap.capacity, snap.allocatable,
                                  self.config)
        if uid != self._owner_uid:
            self._republish(f"the Node's uid is {uid}, not {self._owner_uid}", uid)
        usage = card_usage(self.pods.on_node(self.node), self.node,
                           {card.index: card for card in snap.node.cards})
        missing = publish_allocations(self.client, snap.node, usage)
        if missing:
            self._republish(f"the GPUDevices of cards {missing} are gone", uid)
            publish_allocations(self.client, snap.node, usage)
        return usage

    def outcomes(self) -> Counter[tuple[str, str]]:
        return self.allocator.outcomes.copy()

    def holdings(self, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return list(pods)  # the scheduler's assignments, as they are

    def usage_sinks(self) -> ApiSinks | None:
        """The GPUDevices' `status.usage` and Events (made on first use: only with usage on)."""
        if self._sinks is None and self.client is not None:
            self._sinks = ApiSinks(self.client, self.node)
        return self._sinks

    def stop(self) -> None:
        self.manager.stop()
