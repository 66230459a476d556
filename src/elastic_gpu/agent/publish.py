"""Publishing a node's GPUs to the API: the one code path for real nodes and fake ones.

`publish_node(client, backend, config, node_name)` discovers the backend's cards, shapes them
as the config says (boards, replicas, MIG), writes the GPUDevice objects and patches the Node's
capacity/allocatable for every advertised GPU resource. The agent calls it at start; the
sandbox calls it with a `FakeBackend` for each kwok node, where no kubelet advertises anything.
On a real node kubelet computes the same numbers for device-plugin resources, so the patch
agrees with it; resources without a plugin (MiB of gpu-memory) exist only through the patch.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.agent.backend import Backend
from elastic_gpu.agent.config import AgentConfig, BackendKind
from elastic_gpu.agent.devices import (
    LogicalCard,
    ResourcePlan,
    build_plans,
    logical_cards,
    node_capacity,
)
from elastic_gpu.agent.inventory_api import ensure_crd, publish_inventory
from elastic_gpu.core.model import Node
from elastic_gpu.core.resources import is_gpu_resource


@dataclass(frozen=True)
class NodeSnapshot:
    """What a node offers right now."""

    node: Node
    cards: tuple[LogicalCard, ...]
    plans: tuple[ResourcePlan, ...]
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]


def snapshot(node_name: str, cards: tuple[LogicalCard, ...], config: AgentConfig,
             plans: tuple[ResourcePlan, ...] | None = None) -> NodeSnapshot:
    plans = tuple(build_plans(cards, config)) if plans is None else plans
    capacity, allocatable = node_capacity(cards, config, plans)
    node = Node(node_name, 0, 0, tuple(lc.card for lc in cards))
    return NodeSnapshot(node, cards, plans, capacity, allocatable)


def discover(backend: Backend, config: AgentConfig, node_name: str) -> NodeSnapshot:
    return snapshot(node_name, logical_cards(backend.discover(), config.splitBoard), config)


def _ours(name: str, config: AgentConfig) -> bool:
    return is_gpu_resource(name) or name == config.time_sliced_resource


def patch_node_capacity(client: Any, node_name: str, capacity: Mapping[str, str],
                        allocatable: Mapping[str, str], config: AgentConfig) -> str:
    """Set the GPU resources of the Node's status; GPU resources no longer offered are removed
    (a merge patch with null), everything else (CPU, memory, pods) is left alone.
    Returns the Node's uid."""
    from lightkube.resources.core_v1 import Node as K8sNode
    from lightkube.types import PatchType

    current = client.get(K8sNode, node_name)
    stale = {name for name in (current.status.capacity or {}) if _ours(name, config)}
    stale |= {name for name in (current.status.allocatable or {}) if _ours(name, config)}
    cap: dict[str, str | None] = {name: None for name in stale - set(capacity)}
    alloc: dict[str, str | None] = {name: None for name in stale - set(allocatable)}
    cap.update(capacity)
    alloc.update(allocatable)
    client.patch(K8sNode.Status, node_name, {"status": {"capacity": cap, "allocatable": alloc}},
                 patch_type=PatchType.MERGE)
    return str(current.metadata.uid)


def publish_snapshot(client: Any, snap: NodeSnapshot, config: AgentConfig,
                     reasons: Mapping[int, str] | None = None) -> None:
    uid = patch_node_capacity(client, snap.node.name, snap.capacity, snap.allocatable, config)
    publish_inventory(client, snap.node, reasons, node_uid=uid)


_crd_ready: set[int] = set()
_crd_lock = threading.Lock()


def publish_fake_node(client: Any, inventory: Node, config: AgentConfig | None = None) -> NodeSnapshot:
    """Publish a fake (kwok) node's cards through the fake backend: the sandbox's entry point.
    Creates the GPUDevice CRD on first use with this client."""
    from elastic_gpu.agent.fake import FakeBackend

    with _crd_lock:
        if id(client) not in _crd_ready:
            ensure_crd(client)
            _crd_ready.add(id(client))
    backend = FakeBackend.from_cards(inventory.cards, inventory.name)
    return publish_node(client, backend, config or AgentConfig(backend=BackendKind.NVML),
                        inventory.name)


def publish_node(client: Any, backend: Backend, config: AgentConfig, node_name: str) -> NodeSnapshot:
    """Discover, then publish GPUDevices and Node capacity; returns what was published.
    The GPUDevice CRD must exist (`inventory_api.ensure_crd`)."""
    snap = discover(backend, config, node_name)
    publish_snapshot(client, snap, config)
    return snap
