"""Fake GPU nodes: their inventory, their Node objects, registering them in bulk.

`register_fake_node` is the single way a fake node enters a cluster, so that the node agent's
fake backend can later take it over (publishing the inventory by the same code path as real
nodes) without touching the sandbox or the tests.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.resources import GPU_CORE, GPU_MEMORY, MILLI_PER_PERCENT
from elastic_gpu.devcluster.kwok import FAKE_NODE_ANNOTATION, FAKE_NODE_ANNOTATION_VALUE

NVIDIA_GPU = "nvidia.com/gpu"
#: Labels that tell fake nodes apart and describe their cards the way GPU feature discovery
#: labels real ones.
FAKE_NODE_LABEL = "elasticgpu.io/fake-node"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
PODS_PER_NODE = 256

DEFAULT_GPU_MODEL = "A100-SXM4-80GB"
DEFAULT_GPU_MEMORY_MIB = 81920
DEFAULT_CPU_MILLI = 96_000
DEFAULT_MEMORY_MIB = 786_432


def fake_inventory(name: str, *, gpus: int, gpu_model: str = DEFAULT_GPU_MODEL,
                   gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB,
                   cpu_milli: int = DEFAULT_CPU_MILLI,
                   memory_mib: int = DEFAULT_MEMORY_MIB) -> Node:
    """A node with `gpus` identical healthy cards."""
    if gpus < 0:
        raise ValueError(f"node {name}: GPU count {gpus} is negative")
    cards = tuple(Card(index=i, uuid=f"GPU-fake-{name}-{i}", model=gpu_model,
                       memory_mib=gpu_memory_mib) for i in range(gpus))
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, cards=cards)


def node_capacity(inventory: Node) -> dict[str, str]:
    """What the node advertises: CPU, memory, pods, and its healthy GPUs in every unit."""
    cards = [card for card in inventory.cards if card.healthy]
    capacity = {
        "cpu": f"{inventory.cpu_milli}m",
        "memory": f"{inventory.memory_mib}Mi",
        "pods": str(PODS_PER_NODE),
    }
    if cards:
        capacity[NVIDIA_GPU] = str(len(cards))
        capacity[GPU_CORE] = str(sum(card.compute_milli for card in cards) // MILLI_PER_PERCENT)
        capacity[GPU_MEMORY] = str(sum(card.memory_mib for card in cards))
    return capacity


def node_labels(inventory: Node) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": inventory.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FAKE_NODE_LABEL: "true",
    }
    if inventory.cards:
        first = inventory.cards[0]
        labels[GPU_PRODUCT_LABEL] = first.model.replace(" ", "-")
        labels[GPU_COUNT_LABEL] = str(len(inventory.cards))
        labels[GPU_MEMORY_LABEL] = str(first.memory_mib)
    labels.update(inventory.labels)
    return labels


def node_manifest(inventory: Node) -> dict[str, Any]:
    """The Node object for `inventory`, status included: the apiserver keeps status on create
    (a kubelet registers its node the same way), so one request makes the node complete."""
    capacity = node_capacity(inventory)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": inventory.name,
            "labels": node_labels(inventory),
            "annotations": {FAKE_NODE_ANNOTATION: FAKE_NODE_ANNOTATION_VALUE,
                            "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def register_fake_node(client: Any, inventory: Node) -> None:
    """Create (or bring up to date) the Node for `inventory`; `client` is a lightkube Client."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Node as K8sNode

    manifest = node_manifest(inventory)
    try:
        client.create(codecs.from_dict(manifest))
    except ApiError as err:
        if err.status.code != 409:
            raise
        # It exists (a re-run): make labels, annotations and capacity match the inventory.
        client.patch(K8sNode, inventory.name, {"metadata": manifest["metadata"]})
        client.patch(K8sNode.Status, inventory.name, {"status": manifest["status"]})
    # The cards become GPUDevice objects (and Node capacity) through the node agent's fake
    # backend: the same code path that publishes a real node's inventory.
    from elastic_gpu.agent.publish import publish_fake_node

    publish_fake_node(client, inventory)


def register_fake_nodes(client: Any, inventories: Iterable[Node], parallelism: int = 16) -> int:
    """Register many nodes concurrently (the apiserver handles parallel creates well)."""
    items = list(inventories)
    if not items:
        return 0
    # The first node goes alone: lightkube (msgspec) builds its per-class decoders on first
    # use, and doing that from several threads at once crashes the interpreter (SIGSEGV).
    register_fake_node(client, items[0])
    with ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(items) - 1))) as pool:
        for future in [pool.submit(register_fake_node, client, inv) for inv in items[1:]]:
            future.result()
    return len(items)


def unregister_fake_node(client: Any, name: str) -> None:
    """Remove a fake node with everything the garbage collector would remove (there is no
    kube-controller-manager here): the pods bound to it, its GPUDevice objects, the Node."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Node as K8sNode
    from lightkube.resources.core_v1 import Pod

    from elastic_gpu.agent.inventory_api import GPUDevice
    from elastic_gpu.k8s.gpudevice import NODE_LABEL

    for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": name}):
        _ignore_missing(lambda p=pod: client.delete(Pod, p.metadata.name,
                                                    namespace=p.metadata.namespace,
                                                    grace_period=0))
    try:
        devices = list(client.list(GPUDevice, labels={NODE_LABEL: name}))
    except ApiError as err:
        if err.status.code != 404:  # 404: the GPUDevice CRD was never created
            raise
        devices = []
    for device in devices:
        _ignore_missing(lambda d=device: client.delete(GPUDevice, d.metadata.name))
    _ignore_missing(lambda: client.delete(K8sNode, name))


def _ignore_missing(call: Any) -> None:
    from lightkube.core.exceptions import ApiError

    try:
        call()
    except ApiError as err:
        if err.status.code != 404:
            raise


def uniform_inventories(count: int, *, prefix: str = "gpu-node", gpus: int = 8,
                        gpu_model: str = DEFAULT_GPU_MODEL,
                        gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB) -> list[Node]:
    width = max(3, len(str(count - 1)))
    return [fake_inventory(f"{prefix}-{i:0{width}d}", gpus=gpus, gpu_model=gpu_model,
                           gpu_memory_mib=gpu_memory_mib) for i in range(count)]


#: Known card memory per model name as written in the Alibaba GPU trace's node list.
MODEL_MEMORY_MIB: Mapping[str, int] = {
    "P100": 16 * 1024, "V100": 16 * 1024, "V100M32": 32 * 1024, "V100M16": 16 * 1024,
    "T4": 16 * 1024, "A10": 24 * 1024, "G2": 24 * 1024, "G3": 32 * 1024,
    "A100": 80 * 1024, "H100": 80 * 1024,
}
NODES_CSV_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


class NodesCsvError(ValueError):
    """A node list that does not have the expected shape; the message names file and row."""


def read_nodes_csv(path: Path, *, gpu_memory_mib: int | None = None,
                   limit: int | None = None) -> list[Node]:
    """Read an Alibaba-trace node list (sn,cpu_milli,memory_mib,gpu,model), GPU nodes only.

    Card memory is not in the trace: `gpu_memory_mib` if given, else by model, else 16 GiB.
    """
    nodes: list[Node] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in NODES_CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise NodesCsvError(f"{path}: missing column(s) {', '.join(missing)}; expected "
                                f"a header {','.join(NODES_CSV_COLUMNS)}")
        for row_no, row in enumerate(reader, start=2):
            try:
                gpus = int(row["gpu"])
                cpu = int(row["cpu_milli"])
                mem = int(row["memory_mib"])
            except (TypeError, ValueError):
                raise NodesCsvError(f"{path}:{row_no}: cpu_milli, memory_mib and gpu must be "
                                    f"whole numbers, got {row!r}") from None
            if gpus <= 0:
                continue  # the sandbox is for GPU nodes; CPU-only rows are skipped
            model = (row["model"] or "").strip() or "unknown"
            name = _node_name(row["sn"] or f"node-{row_no}")
            card_mem = gpu_memory_mib or MODEL_MEMORY_MIB.get(model, 16 * 1024)
            nodes.append(fake_inventory(name, gpus=gpus, gpu_model=model,
                                        gpu_memory_mib=card_mem, cpu_milli=cpu,
                                        memory_mib=mem))
            if limit is not None and len(nodes) >= limit:
                break
    return nodes


def _node_name(serial: str) -> str:
    """A valid DNS-1123 subdomain from a trace serial number."""
    cleaned = "".join(c if c.isalnum() or c in "-." else "-" for c in serial.strip().lower())
    return cleaned.strip("-.")[:253] or "node"


def names(inventories: Sequence[Node]) -> list[str]:
    return [inv.name for inv in inventories]
