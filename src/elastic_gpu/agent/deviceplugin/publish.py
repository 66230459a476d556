"""Publishing a device-plugin node's GPUs to the API: the one code path for real nodes and
fake ones.

`publish_node(client, backend, config, node_name)` discovers the backend's cards, shapes them
as the config says (boards, replicas, MIG: `agent.snapshot`), writes the GPUDevice objects and
patches the Node's capacity/allocatable for every advertised GPU resource
(`agent.node_status`). The agent's `DevicePluginNode` publishes the same way at start; the
sandbox calls it with a `FakeBackend` for each kwok node, where no kubelet advertises anything.
Each card's GPUDevice also says what that card backs (`spec.resources`, `snapshot.card_offers`):
the scheduler checks a pod's resource names and counts time-sliced replicas per card from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.agent.backends.base import Backend
from elastic_gpu.agent.config import AgentConfig, BackendKind
from elastic_gpu.agent.deviceplugin.inventory_api import create_inventory, publish_inventory
from elastic_gpu.agent.node_status import patch_node_capacity
from elastic_gpu.agent.snapshot import NodeSnapshot, discover
from elastic_gpu.core.model import Node
from elastic_gpu.kube.sync import SyncKubeClient


def publish_snapshot(client: SyncKubeClient, snap: NodeSnapshot, config: AgentConfig,
                     reasons: Mapping[int, str] | None = None) -> str:
    """The Node's capacity, then the GPUDevices, owned by the Node; returns the Node's uid."""
    uid = patch_node_capacity(client, snap.node.name, snap.capacity, snap.allocatable, config)
    publish_inventory(client, snap.node, reasons, node_uid=uid)
    return uid


def publish_fake_node(client: SyncKubeClient, inventory: Node,
                      config: AgentConfig | None = None) -> NodeSnapshot:
    """Publish a fake (kwok) node's cards through the fake backend: the sandbox's entry point.
    The GPUDevice CRD must be installed (`inventory_api.ensure_crd`: the sandbox is the
    installer there, with admin credentials, not an agent)."""
    from elastic_gpu.agent.backends.fake import FakeBackend

    backend = FakeBackend.from_cards(inventory.cards, inventory.name)
    return publish_node(client, backend, config or AgentConfig(backend=BackendKind.NVML),
                        inventory.name)


def publish_new_fake_node(client: SyncKubeClient, inventory: Node, config: AgentConfig,
                          node_uid: str) -> NodeSnapshot:
    """Publish the cards of a fake node whose Node was created just now with the capacity
    the agent advertises (`devcluster.nodes.node_manifest`) and which has no GPUDevices yet:
    the same objects as `publish_fake_node`, created without reading anything back (for
    loading thousands of nodes into a new cluster: `devcluster.nodes.create_fake_node`)."""
    from elastic_gpu.agent.backends.fake import FakeBackend

    snap = discover(FakeBackend.from_cards(inventory.cards, inventory.name), config,
                    inventory.name)
    create_inventory(client, snap.node, node_uid=node_uid)
    return snap


def publish_node(client: SyncKubeClient, backend: Backend, config: AgentConfig,
                 node_name: str) -> NodeSnapshot:
    """Discover, then publish GPUDevices and Node capacity; returns what was published.
    The GPUDevice CRD must be installed (deploy/crds/gpudevices.yaml; the agent checks with
    `inventory_api.require_crd` at start)."""
    snap = discover(backend, config, node_name)
    publish_snapshot(client, snap, config)
    return snap


def sync_fake_allocations(client: SyncKubeClient) -> int:
    """Allocation columns and holders of every GPUDevice from all pods' assignments, in two
    LISTs; only cards whose columns changed are written. For nodes no agent runs on (kwok
    nodes of the sandbox); a real node's agent keeps its own cards current. Returns the cards
    written."""
    from elastic_gpu.agent.accounting import CardUse, card_usage
    from elastic_gpu.agent.deviceplugin.inventory_api import list_gpudevices, patch_allocation
    from elastic_gpu.api.gpudevice import GPUDeviceError, allocation_status, card_from_object
    from elastic_gpu.kube.resources import PODS

    pods_by_node: dict[str, list[dict[str, Any]]] = {}
    pods, _ = client.list(PODS.path())
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            pods_by_node.setdefault(str(node), []).append(pod)
    cards_by_node: dict[str, dict[int, Any]] = {}
    devices = []
    for device in list_gpudevices(client):
        try:
            node, card = card_from_object(device)
        except GPUDeviceError:
            continue  # not ours to repair; the scheduler reports it
        cards_by_node.setdefault(node, {})[card.index] = card
        devices.append((device, node, card))
    usage = {node: card_usage(pods_by_node.get(node, []), node, cards)
             for node, cards in cards_by_node.items()}
    written = 0
    for device, node, card in devices:
        use = usage[node].get(card.index, CardUse())
        wanted = allocation_status(card.compute_milli, use.milli, use.memory_mib, use.holders)
        status = device.get("status") or {}
        if any(status.get(key) != value for key, value in wanted.items()):
            patch_allocation(client, device["metadata"]["name"], card.compute_milli, use)
            written += 1
    return written
