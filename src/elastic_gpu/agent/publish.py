"""Publishing a node's GPUs to the API: the one code path for real nodes and fake ones.

`publish_node(client, backend, config, node_name)` discovers the backend's cards, shapes them
as the config says (boards, replicas, MIG), writes the GPUDevice objects and patches the Node's
capacity/allocatable for every advertised GPU resource. The agent calls it at start; the
sandbox calls it with a `FakeBackend` for each kwok node, where no kubelet advertises anything.
On a real node kubelet computes the same numbers for device-plugin resources, so the patch
agrees with it; resources without a plugin (MiB of gpu-memory) exist only through the patch.
Each card's GPUDevice also says what that card backs (`spec.resources`, from `card_offers`):
the scheduler checks a pod's resource names and counts time-sliced replicas per card from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from elastic_gpu.agent.backends.base import Backend
from elastic_gpu.agent.config import AgentConfig, BackendKind, MigStrategy
from elastic_gpu.agent.devices import (
    LogicalCard,
    ResourcePlan,
    build_plans,
    logical_cards,
    node_capacity,
    status_only_resources,
)
from elastic_gpu.agent.inventory_api import create_inventory, publish_inventory
from elastic_gpu.core.model import Node
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.quota import with_accounting
from elastic_gpu.core.resources import is_gpu_resource, lookup
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient


@dataclass(frozen=True)
class NodeSnapshot:
    """What a node offers right now."""

    node: Node
    cards: tuple[LogicalCard, ...]
    plans: tuple[ResourcePlan, ...]
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]


def card_offers(cards: Sequence[LogicalCard], config: AgentConfig,
                plans: Sequence[ResourcePlan]) -> dict[int, dict[str, int]]:
    """Per logical card, what it backs: resource name -> its devices on that card (every
    device, healthy or not, like capacity). Device-plugin resources count their units per card
    (time-sliced replicas, percent shares, memory units, MIG instances); memory resources
    advertised in Node status only count the card's memory in their unit. Summed over the
    cards, it is the node's capacity (a unit test holds them equal)."""
    out: dict[int, dict[str, int]] = {lc.index: {} for lc in cards}
    for plan in plans:
        for unit in plan.devices:
            per_card = out.setdefault(unit.card, {})
            per_card[plan.resource] = per_card.get(plan.resource, 0) + 1
    status_only = status_only_resources(cards, config, plans)
    share_cards = [lc for lc in cards
                   if config.migStrategy is MigStrategy.NONE or not lc.card.mig_enabled]
    for name in status_only:
        spec = lookup(name)
        assert spec is not None  # validated by the config
        for lc in share_cards:
            out[lc.index][name] = lc.card.memory_mib // spec.scale
    return out


def snapshot(node_name: str, cards: tuple[LogicalCard, ...], config: AgentConfig,
             plans: tuple[ResourcePlan, ...] | None = None) -> NodeSnapshot:
    plans = tuple(build_plans(cards, config)) if plans is None else plans
    capacity, allocatable = node_capacity(cards, config, plans)
    offers = card_offers(cards, config, plans)
    node = Node(node_name, 0, 0, tuple(replace(lc.card, offers=offers[lc.index]) for lc in cards))
    return NodeSnapshot(node, cards, plans, capacity, allocatable)


def discover(backend: Backend, config: AgentConfig, node_name: str) -> NodeSnapshot:
    return snapshot(node_name, logical_cards(backend.discover(), config.splitBoard), config)


def _ours(name: str, config: AgentConfig) -> bool:
    return is_gpu_resource(name) or name in (config.time_sliced_resource, NODE_CORE)


def status_patch(status: Mapping[str, Any], capacity: Mapping[str, str],
                 allocatable: Mapping[str, str], config: AgentConfig) -> dict[str, Any] | None:
    """The merge patch of a Node's `status` that makes it carry the node's GPU names as
    `core.quota.with_accounting` says (these GPU names, the quota's accounting names beside
    them), with GPU names no longer offered removed (null) and everything else (CPU, memory,
    pods) left alone; None when it carries them already. Every GPU node advertises the
    accounting names, in either mode: the webhook puts them on every GPU container, and once a
    DeviceClass maps `nvidia.com/gpu` (docs/dra.md), kube-scheduler's DynamicResources filter
    checks every extended resource of such a pod against every node, device-plugin nodes
    included. Counts compare as quantities (the API server writes 1000000000 back as `1G`);
    a restarting kubelet's zero is a count to write again."""
    patch: dict[str, dict[str, str | None]] = {}
    for field, gpu in (("capacity", capacity), ("allocatable", allocatable)):
        want = with_accounting(gpu)
        have = status.get(field) or {}
        changes: dict[str, str | None] = {k: None for k in have
                                          if _ours(k, config) and k not in want}
        changes.update({k: v for k, v in want.items() if not _same(have.get(k), v)})
        if changes:
            patch[field] = changes
    return {"status": patch} if patch else None


def _same(found: Any, want: str) -> bool:
    """Equal quantities (the API server writes 1000000000 back as `1G`)."""
    try:
        return found is not None and parse_quantity(str(found)) == parse_quantity(want)
    except QuantityError:
        return False


def patch_node_capacity(client: SyncKubeClient, node_name: str, capacity: Mapping[str, str],
                        allocatable: Mapping[str, str], config: AgentConfig) -> str:
    """Make the Node's status carry the node's GPU names (`status_patch`); no write when it
    does already (the sync loop calls this periodically because a restarting kubelet zeroes
    every extended resource, including the status-only ones). Returns the Node's uid."""
    current = client.get(NODES.path(name=node_name))
    patch = status_patch(current.get("status") or {}, capacity, allocatable, config)
    if patch is not None:
        client.patch(NODES.path(name=node_name, subresource="status"), patch)
    return str((current.get("metadata") or {}).get("uid"))


def publish_snapshot(client: SyncKubeClient, snap: NodeSnapshot, config: AgentConfig,
                     reasons: Mapping[int, str] | None = None) -> None:
    uid = patch_node_capacity(client, snap.node.name, snap.capacity, snap.allocatable, config)
    publish_inventory(client, snap.node, reasons, node_uid=uid)


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
    from elastic_gpu.agent.inventory_api import list_gpudevices, patch_allocation
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
