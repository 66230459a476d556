"""GPUDevice objects in the API: publishing a node's cards, reading all back.

The object shapes and their conversion live in `elastic_gpu.api.gpudevice` (pure); this module
only talks to the API server, through the project's one client stack (`kube.sync.
SyncKubeClient`: blocking verbs for the agent's threads, typed errors from `kube.errors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.agent.accounting import CardUse
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.model import Card, Node
from elastic_gpu.kube.crds import install_crds
from elastic_gpu.kube.errors import Conflict, NotFound
from elastic_gpu.kube.resources import GPUDEVICES
from elastic_gpu.kube.sync import SyncKubeClient

#: The GPUDevice collection (cluster-scoped) and the Nodes'.


class InventoryApiError(RuntimeError):
    pass


#: What an operator applies before the agent runs (the agent does not install CRDs).
CRD_FILE = "deploy/crds/gpudevices.yaml"


def require_crd(client: SyncKubeClient) -> None:
    """Fail clearly when the GPUDevice CRD is not installed. The agent does not create it:
    CRDs are cluster-wide objects that an installer applies once (`kubectl apply -f
    deploy/crds/gpudevices.yaml`), and a DaemonSet allowed to write CRDs could rewrite any
    of them. This check needs only `list gpudevices`, which the agent has anyway."""
    try:
        client.list(GPUDEVICES.path(), {"limit": "1"})
    except NotFound:
        raise InventoryApiError(
            f"the GPUDevice CRD ({gd.CRD_NAME}) is not installed; apply it first: "
            f"kubectl apply -f {CRD_FILE}") from None


def ensure_crd(client: Any, timeout_s: float = 30.0) -> None:
    """Create (or update) the GPUDevice CRD and wait until the API serves it: what
    `kubectl apply -f deploy/crds/gpudevices.yaml` does at install time, for the sandbox and
    the tests, with an installer's credentials and the client `kube.crds.install_crds` takes
    (the one CRD installer). The agent never calls it (`require_crd`)."""
    install_crds(client, [gd.crd_manifest()], timeout_s)


def _patch_status(client: SyncKubeClient, name: str, status: Mapping[str, Any]) -> None:
    client.patch(GPUDEVICES.path(name=name, subresource="status"), {"status": dict(status)})


def card_object(node_name: str, card: Card, reason: str = "",
                node_uid: str | None = None) -> dict[str, Any]:
    """A card's GPUDevice as published; with `node_uid`, owned by the Node (the garbage
    collector removes it with the Node)."""
    return gd.owned_by_node(gd.card_to_object(node_name, card, reason), node_name, node_uid)


def create_inventory(client: SyncKubeClient, node: Node, node_uid: str | None = None) -> None:
    """Create the GPUDevices of a node known to have none (registered just now in a new
    cluster): the objects `publish_inventory` writes for it, without its reconciling reads.
    Its list of the node's GPUDevices by label costs time in proportion to every GPUDevice
    of the cluster, so publishing N new nodes that way took time in N squared."""
    for card in node.cards:
        obj = card_object(node.name, card, "", node_uid)
        client.create(GPUDEVICES.path(), obj)
        # The status subresource ignores status on create: it is patched right after.
        _patch_status(client, obj["metadata"]["name"], obj["status"])


def publish_inventory(client: SyncKubeClient, node: Node,
                      reasons: Mapping[int, str] | None = None,
                      node_uid: str | None = None) -> None:
    """Make the node's GPUDevices match `node.cards`: create or update each card's object
    (spec, labels, health; allocation columns are left as they are), delete cards gone.
    With `node_uid`, the objects are owned by the Node, so the garbage collector removes them
    with it; an existing object is re-owned (one left by an earlier Node of the same name
    would otherwise be collected under the new one)."""
    reasons = reasons or {}
    wanted = set()
    for card in node.cards:
        obj = card_object(node.name, card, reasons.get(card.index, ""), node_uid)
        name = obj["metadata"]["name"]
        wanted.add(name)
        status = obj["status"]
        try:
            # The status subresource ignores status on create: it is patched right after.
            client.create(GPUDEVICES.path(), obj)
        except Conflict:  # 409: it exists (every 409, as before)
            client.patch(GPUDEVICES.path(name=name), gd.update_patch(obj))
            # An existing card keeps its allocation columns (the sync loop owns them).
            status = {k: status[k] for k in ("health", "reason", "lastHeartbeat")}
        _patch_status(client, name, status)
    existing, _ = client.list(GPUDEVICES.path(), {"labelSelector": f"{gd.NODE_LABEL}={node.name}"})
    for device in existing:
        name = str((device.get("metadata") or {}).get("name"))
        if name not in wanted:
            client.delete(GPUDEVICES.path(name=name))


def publish_health(client: SyncKubeClient, node: Node, reasons: Mapping[int, str]) -> list[int]:
    """Health and reason of each card; returns the cards whose GPUDevice is gone (to
    republish: `publish_inventory`)."""
    missing = []
    for card in node.cards:
        try:
            _patch_status(client, gd.object_name(node.name, card.index),
                          {"health": card.health.value, "reason": reasons.get(card.index, ""),
                           "lastHeartbeat": gd.now_rfc3339()})
        except NotFound:
            missing.append(card.index)
    return missing


def publish_allocations(client: SyncKubeClient, node: Node,
                        usage: Mapping[int, CardUse]) -> list[int]:
    """Allocation columns, holders (and the heartbeat) of each card from pods' assignments;
    returns the cards whose GPUDevice is gone (to republish: `publish_inventory`)."""
    missing = []
    for card in node.cards:
        try:
            patch_allocation(client, gd.object_name(node.name, card.index), card.compute_milli,
                             usage.get(card.index, CardUse()))
        except NotFound:
            missing.append(card.index)
    return missing


def patch_allocation(client: SyncKubeClient, name: str, compute_milli: int, use: CardUse) -> None:
    _patch_status(client, name, {
        **gd.allocation_status(compute_milli, use.milli, use.memory_mib, use.holders),
        "lastHeartbeat": gd.now_rfc3339()})


def list_gpudevices(client: SyncKubeClient) -> list[dict[str, Any]]:
    """Every GPUDevice object, as the API sends it."""
    devices, _ = client.list(GPUDEVICES.path())
    return devices
