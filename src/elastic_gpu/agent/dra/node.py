"""The agent in DRA mode (`dra.enabled`), `DraNode` behind `agent.nodemode.NodeMode`: what it
publishes and serves instead of device plugins.

A node is in one mode. In DRA mode the agent

- refuses to start unless its Node carries the label `elasticgpu.io/gpu-mode: dra` (the
  operator's node-group label, which the scheduler extender reads to leave the node to
  kube-scheduler's DynamicResources plugin): a node the extender still takes for a
  device-plugin node would be given pods whose cards nothing on the node serves;
- publishes the node's cards as ResourceSlices (`slices_api.publish_node_slices`) at start,
  on every health change, each time kubelet registers the plugin and every `syncSeconds`
  (kubelet deletes its node's DRA slices when it starts, and a driver's 30 s after its plugin
  went), and never withdraws them on stop: kube-scheduler must keep seeing the devices it
  allocated while the agent restarts (the slices are the Node's, so they go with it);
- publishes **no GPUDevice objects** and serves no device plugin: the extender counts a
  GPUDevice's card as free for device-plugin pods, and the same card would then be handed
  out twice, once by kube-scheduler's allocator and once by the extender;
- advertises, of the GPU names in the Node's status, only `node.elasticgpu.io/gpu-core`
  (`core/nodefit.py`: a lower bound kube-scheduler counts; every GPU pod the webhook mutated
  asks for it, so such pods still fit a DRA node), and removes device-plugin names a previous
  mode left; beside it the quota's accounting names (`core.quota.QUOTA_NAMES`) at a count no
  node's pods reach: the webhook puts them on every GPU container, and kube-scheduler's
  DynamicResources filter (KEP-5004) and kubelet's admission check every extended resource of
  an `nvidia.com/gpu` pod served through the DeviceClass, so without them such a pod fits no
  DRA node (the scheduler side found it on kwok: `core.quota.with_accounting`);
- serves the kubelet's DRA plugin (`kubelet_plugin`) and its device health stream (`health`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Sized
from concurrent.futures import Future
from typing import Any

from elastic_gpu.agent.accounting import CardUse
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.agent.dra.guard import pods_to_tell
from elastic_gpu.agent.dra.holdings import with_holdings
from elastic_gpu.agent.dra.kubelet_plugin import (
    DraPlugin,
    KubeletPluginServer,
    api_claim_reader,
    api_pod_reader,
)
from elastic_gpu.agent.dra.miglayout import SliceFence, claim_holders, with_fences
from elastic_gpu.agent.dra.prepare import GrantInputs
from elastic_gpu.agent.dra.slices_api import publish_node_slices
from elastic_gpu.agent.miglayout import HeldOn
from elastic_gpu.agent.node_status import patch_node_capacity
from elastic_gpu.agent.nodemode import NodeModeError
from elastic_gpu.agent.state import NodeState
from elastic_gpu.agent.usage.sinks import COMPONENT, ApiSinks
from elastic_gpu.core.dra.capacity_guard import REASON as OVER_CAPACITY
from elastic_gpu.core.dra.nodemode import (
    GPU_MODE_DRA,
    GPU_MODE_LABEL,
    is_dra_node,
    node_object_labels,
)
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.nodefit import node_capacity as node_core_capacity
from elastic_gpu.kube.events import WARNING, EventRecorder
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)



def dra_capacity(cards: Sized) -> dict[str, str]:
    """The GPU names of a DRA node's status (`agent.node_status` adds the quota's accounting
    names): only the node-level count kube-scheduler reads. The sandbox's kwok DRA nodes are
    made with it too (`devcluster.nodes`)."""
    if not cards:
        return {}
    return {NODE_CORE: str(node_core_capacity([1] * len(cards)))}


def mode_refusal(node: Mapping[str, Any], name: str) -> str | None:
    """Why the Node (as read from the API) is not a DRA-mode node (None: it is)."""
    labels = node_object_labels(node)
    if is_dra_node(labels):
        return None
    value = labels.get(GPU_MODE_LABEL)
    found = "has no such label" if value is None else f"has {GPU_MODE_LABEL}={value}"
    return (f"dra.enabled is set but Node {name} {found}: the node must be in the DRA node "
            f"group ({GPU_MODE_LABEL}: {GPU_MODE_DRA}, set by the chart's DRA node group) so that "
            "the scheduler extender leaves its GPUs to kube-scheduler; label it, or run the "
            "agent without dra.enabled")


class DraNode:
    """The DRA node mode (`agent.nodemode`); the API is required (ResourceSlices,
    ResourceClaims)."""

    def __init__(self, config: AgentConfig, node: str, client: SyncKubeClient,
                 state: NodeState, inputs: GrantInputs) -> None:
        self.config = config
        self.node = node
        self.client = client
        self.cards: Callable[[], Mapping[int, LogicalCard]] = state.cards
        self.node_uid: str | None = None
        dra = config.dra
        self.plugin = DraPlugin(node, api_claim_reader(client), state.cards, inputs,
                                dra.pluginDirectory, dra.cdiDirectory, api_pod_reader(client))
        self.server = KubeletPluginServer(self.plugin, dra.pluginDirectory, dra.registryDirectory, state)
        # a claim refused for capacity: a Warning Event on the pods it is reserved for (the
        # recorder made, and run in the client's loop, at the first refusal)
        self.recorder: EventRecorder | None = None
        self._events: Future[None] | None = None
        self.plugin.on_refused = self._refused
        self.server.registration.on_registered = self._registered
        # the health loop, the sync loop and kubelet's registration publish: one at a time,
        # or two would write the same new generation and one would fail on the other's
        self._publishing = threading.Lock()
        #: the cards fenced while their MIG layout changes (tainted in the slices)
        self.fence = SliceFence(client, node, self.publish)

    def _registered(self) -> None:
        try:
            self.publish()
        except Exception:
            log.exception("publishing ResourceSlices after kubelet's registration")

    def check_node(self) -> None:
        """Raise NodeModeError unless the Node is labelled for DRA; remembers its uid."""
        node = self.client.get(NODES.path(name=self.node))
        refusal = mode_refusal(node, self.node)
        if refusal is not None:
            raise NodeModeError(refusal)
        self.node_uid = str((node.get("metadata") or {}).get("uid") or "") or None

    def publish(self) -> bool:
        """ResourceSlices and the Node's status say the cards as they are now; True when the
        slices were written."""
        with self._publishing:
            return self._publish()

    def _publish(self) -> bool:
        cards = self.cards()
        capacity = dra_capacity(cards)
        patch_node_capacity(self.client, self.node, capacity, capacity, self.config)
        written = publish_node_slices(
            self.client, self.node,
            with_fences([lc.card for _, lc in sorted(cards.items())], self.fence.current()),
            self.node_uid)
        if written:
            log.info("published the ResourceSlices of %s (%d cards)", self.node, len(cards))
        return written

    def capacity(self) -> tuple[Mapping[str, str], Mapping[str, str]]:
        capacity = dra_capacity(self.cards())
        return capacity, capacity

    def start(self) -> None:
        """Refuse a Node outside the DRA node group, before anything is published; publish."""
        self.check_node()
        self.fence.load()  # a fence left by a killed agent stays until its applier lifts it
        self.publish()

    def serve(self) -> None:
        self.server.start()

    def _refused(self, claim: Mapping[str, Any], message: str) -> None:
        """Called under the plugin's lock (one refusal at a time)."""
        if self.recorder is None:
            self.recorder = EventRecorder(self.client.async_client, COMPONENT, self.node)
            self._events = self.client.submit(self.recorder.run())
        for pod in pods_to_tell(claim):
            self.client.loop.call_soon_threadsafe(self.recorder.record, pod, WARNING,
                                                  OVER_CAPACITY, message)

    def cards_changed(self) -> None:
        self.publish()

    def reasons_changed(self) -> None:
        pass  # no GPUDevice to carry a reason; the health stream says a device's health

    @property
    def applies_mig_layouts(self) -> bool:
        return True  # the fence is the slices' taint, the holders are the claims

    def layout_changed(self) -> None:
        """A MIG step changed a card: its partitionable devices and counters republished."""
        self.publish()

    def mig_seam(self) -> tuple[SliceFence, HeldOn]:
        """The applier's fence and holders on this node (`agent.dra.miglayout`)."""
        return self.fence, claim_holders(self.client, self.node)

    def sync(self) -> dict[int, CardUse]:
        """Re-assert the Node's count and the slices (a kubelet restart zeroes extended
        resources; someone may have deleted a slice); no GPUDevice columns to write."""
        self.publish()
        return {}

    def outcomes(self) -> Counter[tuple[str, str]]:
        return Counter()  # grants are NodePrepareResources calls, not Allocate

    def holdings(self, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return with_holdings(pods, self.node, self.plugin.checkpoint.claims())

    def usage_sinks(self) -> ApiSinks | None:
        return None  # no GPUDevice to write status.usage to: a DRA node's usage is metrics only

    def stop(self) -> None:
        # the slices stay: kube-scheduler keeps seeing the devices it allocated
        self.server.stop()
        if self._events is not None:
            self._events.cancel()
