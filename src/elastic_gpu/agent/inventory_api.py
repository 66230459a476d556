"""GPUDevice objects in the API: the CRD, publishing a node's cards, reading all back.

The object shapes and their conversion live in `elastic_gpu.api.gpudevice` (pure); this module
only talks to the API server through a lightkube `Client` (sync).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from elastic_gpu.agent.accounting import CardUse
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.model import Node


def gpudevice_resource() -> Any:
    from lightkube.generic_resource import create_global_resource

    return create_global_resource(gd.GROUP, gd.VERSION, gd.KIND, gd.PLURAL)


GPUDevice = gpudevice_resource()


class InventoryApiError(RuntimeError):
    pass


#: What an operator applies before the agent runs (the agent does not install CRDs).
CRD_FILE = "deploy/crds/gpudevices.yaml"


def require_crd(client: Any) -> None:
    """Fail clearly when the GPUDevice CRD is not installed. The agent does not create it:
    CRDs are cluster-wide objects that an installer applies once (`kubectl apply -f
    deploy/crds/gpudevices.yaml`), and a DaemonSet allowed to write CRDs could rewrite any
    of them. This check needs only `list gpudevices`, which the agent has anyway."""
    from lightkube.core.exceptions import ApiError

    try:
        for _ in client.list(GPUDevice, chunk_size=1):
            break
    except ApiError as err:
        if err.status.code == 404:
            raise InventoryApiError(
                f"the GPUDevice CRD ({gd.CRD_NAME}) is not installed; apply it first: "
                f"kubectl apply -f {CRD_FILE}") from None
        raise


def ensure_crd(client: Any, timeout_s: float = 30.0) -> None:
    """Create (or update) the GPUDevice CRD and wait until the API serves it: what
    `kubectl apply -f deploy/crds/gpudevices.yaml` does at install time, for the sandbox and
    the tests (an installer's credentials). The agent never calls it (`require_crd`)."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
    from lightkube.types import PatchType

    manifest = gd.crd_manifest()
    try:
        client.create(codecs.from_dict(manifest))
    except ApiError as err:
        if err.status.code != 409:
            raise
        client.patch(CustomResourceDefinition, gd.CRD_NAME, {"spec": manifest["spec"]},
                     patch_type=PatchType.MERGE)
    deadline = time.monotonic() + timeout_s
    while True:
        crd = client.get(CustomResourceDefinition, gd.CRD_NAME)
        conditions = (crd.status.conditions if crd.status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            break
        if time.monotonic() > deadline:
            raise InventoryApiError(f"CRD {gd.CRD_NAME} not established after {timeout_s}s")
        time.sleep(0.1)
    # Established is not yet servable: the apiserver answers 429 "storage is (re)initializing"
    # (or 404) for a moment; wait until a list works.
    while True:
        try:
            for _ in client.list(GPUDevice, chunk_size=1):
                break
            return
        except ApiError as err:
            if err.status.code not in (404, 429):
                raise
        if time.monotonic() > deadline:
            raise InventoryApiError(f"CRD {gd.CRD_NAME} established but not served after {timeout_s}s")
        time.sleep(0.1)


def _patch_status(client: Any, name: str, status: Mapping[str, Any]) -> None:
    from lightkube.types import PatchType

    client.patch(GPUDevice.Status, name, {"status": dict(status)}, patch_type=PatchType.MERGE)


def publish_inventory(client: Any, node: Node, reasons: Mapping[int, str] | None = None,
                      node_uid: str | None = None) -> None:
    """Make the node's GPUDevices match `node.cards`: create or update each card's object
    (spec, labels, health; allocation columns are left as they are), delete cards gone.
    With `node_uid`, the objects are owned by the Node, so the garbage collector removes them
    with it."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.types import PatchType

    reasons = reasons or {}
    wanted = set()
    for card in node.cards:
        obj = gd.card_to_object(node.name, card, reasons.get(card.index, ""))
        if node_uid:
            obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node",
                                                   "name": node.name, "uid": node_uid}]
        name = obj["metadata"]["name"]
        wanted.add(name)
        status = obj["status"]
        try:
            # The status subresource ignores status on create: it is patched right after.
            client.create(codecs.from_dict(obj))
        except ApiError as err:
            if err.status.code != 409:
                raise
            client.patch(GPUDevice, name, {"metadata": {"labels": obj["metadata"]["labels"]},
                                           "spec": obj["spec"]}, patch_type=PatchType.MERGE)
            # An existing card keeps its allocation columns (the sync loop owns them).
            status = {k: status[k] for k in ("health", "reason", "lastHeartbeat")}
        _patch_status(client, name, status)
    for existing in client.list(GPUDevice, labels={gd.NODE_LABEL: node.name}):
        if existing.metadata.name not in wanted:
            client.delete(GPUDevice, existing.metadata.name)


def publish_health(client: Any, node: Node, reasons: Mapping[int, str]) -> None:
    for card in node.cards:
        _patch_status(client, gd.object_name(node.name, card.index),
                      {"health": card.health.value, "reason": reasons.get(card.index, ""),
                       "lastHeartbeat": gd.now_rfc3339()})


def publish_allocations(client: Any, node: Node, usage: Mapping[int, CardUse]) -> None:
    """Allocation columns, holders (and the heartbeat) of each card from pods' assignments."""
    for card in node.cards:
        patch_allocation(client, gd.object_name(node.name, card.index), card.compute_milli,
                         usage.get(card.index, CardUse()))


def patch_allocation(client: Any, name: str, compute_milli: int, use: CardUse) -> None:
    _patch_status(client, name, {
        **gd.allocation_status(compute_milli, use.milli, use.memory_mib, use.holders),
        "lastHeartbeat": gd.now_rfc3339()})


def read_inventory(client: Any) -> list[Node]:
    """Every node's cards as core Nodes (CPU/memory/labels from the Node objects)."""
    from lightkube.resources.core_v1 import Node as K8sNode

    devices = [obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
               for obj in client.list(GPUDevice)]
    nodes = [n.to_dict() for n in client.list(K8sNode)]
    return gd.nodes_from_objects(devices, nodes)
