"""Fake GPU nodes: their inventory, their Node objects, registering them in bulk.

`register_fake_node` is the single way a fake node enters a cluster: it creates the Node and
publishes the cards through the node agent's fake backend, with an agent configuration
(`AgentConfig` or its YAML/dict form), by the very code path a real agent with that
configuration publishes a real node. So an IX node (resources.gpu iluvatar.com/gpu,
timeSlicing.replicas 4, 2 cards) advertises `iluvatar.com/gpu: 8` and each of its GPUDevices
says it backs 4 of them. Without a configuration, fake nodes get `FAKE_NODE_AGENT_CONFIG`:
the agent's defaults with migStrategy mixed (so cards carved into MIG instances advertise them).
"""

from __future__ import annotations

import contextlib
import csv
import re
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_gpu.agent.backends.fake import board_chips
from elastic_gpu.agent.config import (
    AgentConfig,
    MigStrategy,
    parse_config,
)
from elastic_gpu.api.config.loader import (
    ConfigError,
    header_problems,
    read_file,
    without_header,
)
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.dra.nodemode import GpuMode, is_dra_node
from elastic_gpu.core.mig.layout import layout_starts
from elastic_gpu.core.mig.profiles import MIG_MODELS, card_slices, mig_model
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.quota import with_accounting
from elastic_gpu.core.resources import MigProfile, ResourceError
from elastic_gpu.devcluster.dra_nodes import (
    FAKE_INVENTORY_ANNOTATION,
    as_dra,
    dra_agent_cards,
    inventory_json,
    register_dra_node,
)
from elastic_gpu.devcluster.kwok import FAKE_NODE_ANNOTATION, FAKE_NODE_ANNOTATION_VALUE
from elastic_gpu.kube.client import STRATEGIC_PATCH
from elastic_gpu.kube.crds import install_crds
from elastic_gpu.kube.errors import Conflict, NotFound
from elastic_gpu.kube.resources import GPUDEVICES, NODES, PODS
from elastic_gpu.kube.sync import SyncKubeClient

NVIDIA_GPU = "nvidia.com/gpu"
#: How fake nodes are published when no agent configuration is given.
FAKE_NODE_AGENT_CONFIG = AgentConfig(migStrategy=MigStrategy.MIXED)
AgentConfigLike = AgentConfig | Mapping[str, Any]
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
                   memory_mib: int = DEFAULT_MEMORY_MIB, chips_per_board: int = 1) -> Node:
    """A node with `gpus` identical healthy cards; with `chips_per_board` > 1 each card is a
    board of that many chips of `gpu_memory_mib` each (`board_inventory_cards`)."""
    if gpus < 0:
        raise ValueError(f"node {name}: GPU count {gpus} is negative")
    if chips_per_board < 1:
        raise ValueError(f"node {name}: chips per board {chips_per_board} must be at least 1")
    if chips_per_board > 1:
        cards = board_inventory_cards(name, gpus, chips_per_board, gpu_model, gpu_memory_mib)
    else:
        cards = tuple(Card(index=i, uuid=f"GPU-fake-{name}-{i}", model=gpu_model,
                           memory_mib=gpu_memory_mib) for i in range(gpus))
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, cards=cards)


def board_inventory_cards(node: str, boards: int, chips_per_board: int, model: str,
                          memory_mib: int) -> tuple[Card, ...]:
    """`boards` multi-chip boards (an IX BI-V150 node: 2 chips each), laid out as the agent's
    fake backend lays out its inventory's `boards:` (it publishes them): board `b` is
    `GPU-fake-<node>-<b>`, its chips `<board>-chip<k>`, numbered one after another, each of
    `memory_mib`."""
    cards: list[Card] = []
    for b in range(boards):
        cards.extend(board_chips(f"GPU-fake-{node}-{b}", model=model, chips=chips_per_board,
                                 memory_mib=memory_mib, first_index=len(cards)))
    return tuple(cards)


def as_agent_config(config: AgentConfigLike | None, source: str = "agent config") -> AgentConfig:
    """An `AgentConfig` from itself, its dict (YAML) form, or None (the fake-node default);
    a bad dict raises `ConfigError` naming the field."""
    if config is None:
        return FAKE_NODE_AGENT_CONFIG
    if isinstance(config, AgentConfig):
        return config
    return parse_config(dict(config), source)


def _host(inventory: Node) -> dict[str, str]:
    return {"cpu": f"{inventory.cpu_milli}m", "memory": f"{inventory.memory_mib}Mi",
            "pods": str(PODS_PER_NODE)}


def gpu_status(inventory: Node, config: AgentConfigLike | None = None
               ) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of the GPU names, exactly as the agent's node mode with
    `config` advertises them for these cards (its own functions compute them): a DRA node's
    node-level count (`agent.dra.node.dra_capacity`) of the cards it publishes (a board is
    one unless `splitBoard`), a device-plugin node's resources."""
    from elastic_gpu.agent.devices import build_plans, logical_cards
    from elastic_gpu.agent.devices import node_capacity as agent_capacity
    from elastic_gpu.agent.dra.node import dra_capacity

    cfg = as_agent_config(config)
    if is_dra_node(inventory.labels):
        capacity = dra_capacity(dra_agent_cards(inventory, cfg))
        return capacity, dict(capacity)
    cards = logical_cards(inventory.cards, cfg.splitBoard)
    return agent_capacity(cards, cfg, build_plans(cards, cfg))


def published_cards(inventory: Node, config: AgentConfigLike | None = None) -> int:
    """How many cards (GPUDevice objects) the agent with `config` publishes for the node:
    a multi-chip board is one card unless the config splits it; none in DRA mode."""
    from elastic_gpu.agent.devices import logical_cards

    if is_dra_node(inventory.labels):
        return 0

    return len(logical_cards(inventory.cards, as_agent_config(config).splitBoard))


def node_capacity(inventory: Node, config: AgentConfigLike | None = None) -> dict[str, str]:
    """What the node offers to pods (allocatable): CPU, memory, pods, and its healthy GPUs in
    every unit the agent with `config` advertises."""
    return {**_host(inventory), **gpu_status(inventory, config)[1]}


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


def node_manifest(inventory: Node, config: AgentConfigLike | None = None) -> dict[str, Any]:
    """The Node object for `inventory`, in either node mode, status included: the apiserver
    keeps status on create (a kubelet registers its node the same way), so one request makes
    the node complete, and the agent's capacity patch that follows finds nothing to change (its
    GPU names are the status that patch leaves: `gpu_status`, `core.quota.with_accounting`).
    A DRA node also carries, for its stand-in agent, the cards a DRA agent with `config`
    publishes (`FAKE_INVENTORY_ANNOTATION`, `dra_agent_cards`)."""
    cfg = as_agent_config(config)
    gpu_capacity, gpu_allocatable = gpu_status(inventory, cfg)
    annotations = {FAKE_NODE_ANNOTATION: FAKE_NODE_ANNOTATION_VALUE,
                   "node.alpha.kubernetes.io/ttl": "0"}
    if is_dra_node(inventory.labels):
        annotations[FAKE_INVENTORY_ANNOTATION] = inventory_json(
            inventory.name, dra_agent_cards(inventory, cfg))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": inventory.name,
            "labels": node_labels(inventory),
            "annotations": annotations,
        },
        "spec": {},
        "status": {"capacity": {**_host(inventory), **with_accounting(gpu_capacity)},
                   "allocatable": {**_host(inventory), **with_accounting(gpu_allocatable)}},
    }


def register_fake_node(client: SyncKubeClient, inventory: Node,
                       agent_config: AgentConfigLike | None = None) -> None:
    """Create (or bring up to date) the Node for `inventory` and publish its cards as the
    agent with `agent_config` would."""
    config = as_agent_config(agent_config, f"node {inventory.name}: agent config")
    manifest = node_manifest(inventory, config)
    if is_dra_node(inventory.labels):  # its cards are ResourceSlices (devcluster.dra_nodes)
        register_dra_node(client, inventory, manifest, config)
        return
    try:
        client.create(NODES.path(), manifest)
    except Conflict:
        # It exists (a re-run): make labels, annotations and capacity match the inventory.
        client.patch(NODES.path(name=inventory.name), {"metadata": manifest["metadata"]},
                     STRATEGIC_PATCH)
        client.patch(NODES.path(name=inventory.name, subresource="status"),
                     {"status": manifest["status"]}, STRATEGIC_PATCH)
    # The cards become GPUDevice objects (and Node capacity) through the node agent's fake
    # backend: the same code path that publishes a real node's inventory.
    from elastic_gpu.agent.deviceplugin.publish import publish_fake_node

    install_gpudevice_crd_once(client)
    publish_fake_node(client, inventory, config)


def create_fake_node(client: SyncKubeClient, inventory: Node,
                     agent_config: AgentConfigLike | None = None) -> None:
    """Register a node known not to exist yet (a new cluster): the Node, its status already
    the capacity the agent advertises, then its cards' GPUDevices, the objects
    `register_fake_node` publishes, without reading anything back. `register_fake_node`
    reconciles (a re-run finds the node there) and its read of the node's GPUDevices by label
    costs time in proportion to the cluster: N nodes took time in N squared (1,000 nodes:
    118-290 s). A node that exists already is a Conflict here."""
    from elastic_gpu.agent.deviceplugin.publish import publish_new_fake_node

    config = as_agent_config(agent_config, f"node {inventory.name}: agent config")
    if is_dra_node(inventory.labels):
        register_dra_node(client, inventory, node_manifest(inventory, config), config, new=True)
        return
    created = client.create(NODES.path(), node_manifest(inventory, config))
    install_gpudevice_crd_once(client)
    publish_new_fake_node(client, inventory, config, str(created["metadata"]["uid"]))


_crd_installed: weakref.WeakSet[SyncKubeClient] = weakref.WeakSet()
_crd_lock = threading.Lock()


def install_gpudevice_crd_once(client: SyncKubeClient) -> None:
    """Install the GPUDevice CRD on first use of `client`, as `kubectl apply -f
    deploy/crds/gpudevices.yaml` would: the sandbox is the installer here (admin
    credentials), not an agent, which only requires the CRD."""
    from elastic_gpu.api import gpudevice

    with _crd_lock:
        if client not in _crd_installed:
            install_crds(client, [gpudevice.crd_manifest()])
            _crd_installed.add(client)


def register_fake_nodes(client: SyncKubeClient, inventories: Iterable[Node], parallelism: int = 16,
                        agent_config: AgentConfigLike | None = None,
                        agent_configs: Mapping[str, AgentConfigLike] | None = None,
                        new: bool = False) -> int:
    """Register many nodes concurrently (the apiserver handles parallel creates well), each
    published with `agent_configs[node name]`, else `agent_config`, else the default.
    `new`: none of the nodes exists yet (a new cluster): each is created outright
    (`create_fake_node`: no reads, so loading N nodes takes time in N, not N squared)."""
    items = list(inventories)
    if not items:
        return 0
    per_node = agent_configs or {}
    # Validate every configuration before the first node is created.
    configs = {inv.name: as_agent_config(per_node.get(inv.name, agent_config),
                                         f"node {inv.name}: agent config")
               for inv in items}
    # The first node goes alone: registering it installs the GPUDevice CRD the others need
    # (once per client), and any decoder built on first use is built by one thread.
    register = create_fake_node if new else register_fake_node
    register(client, items[0], configs[items[0].name])
    with ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(items) - 1))) as pool:
        for future in [pool.submit(register, client, inv, configs[inv.name])
                       for inv in items[1:]]:
            future.result()
    return len(items)


def unregister_fake_node(client: SyncKubeClient, name: str) -> None:
    """Remove a fake node with what would otherwise outlive it: the pods bound to it, its
    GPUDevice objects, the Node. Done here, at once, rather than left to
    kube-controller-manager (which may be off, and whose pod GC waits on orphaned pods)."""
    from elastic_gpu.api import gpudevice as gd

    pods, _ = client.list(PODS.path(), {"fieldSelector": f"spec.nodeName={name}"})
    for pod in pods:
        meta = pod["metadata"]
        with contextlib.suppress(NotFound):
            client.delete(PODS.path(meta["namespace"], meta["name"]), grace_period_s=0)
    devices_resource = GPUDEVICES
    try:
        devices, _ = client.list(devices_resource.path(),
                                 {"labelSelector": f"{gd.NODE_LABEL}={name}"})
    except NotFound:  # the GPUDevice CRD was never created
        devices = []
    for device in devices:
        with contextlib.suppress(NotFound):
            client.delete(devices_resource.path(name=device["metadata"]["name"]))
    from elastic_gpu.agent.dra.slices_api import withdraw_node_slices

    withdraw_node_slices(client, name)  # a DRA-mode node's
    with contextlib.suppress(NotFound):
        client.delete(NODES.path(name=name))


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


# ---------------------------------------------------------------------------- cluster files

class ClusterSpecError(ValueError):
    """A cluster file (`egpu sandbox up --cluster`) that cannot be used; the message names
    the field, its value and the rule."""


#: The fake inventory's limit on chips per board, and the sandbox's on chips per node.
MAX_CHIPS_PER_BOARD = 8
MAX_CHIPS_PER_NODE = 64
_GROUP_KEYS = ("name", "count", "gpus", "model", "memoryMiB", "chipsPerBoard", "mig",
               "agentConfig", "gpuMode", "migDynamic")
#: `gpuMode` of a node group: its GPUs as GPUDevices and device-plugin resources, or through
#: DRA (`devcluster.dra_nodes`)
GPU_MODES = tuple(mode.value for mode in GpuMode)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
#: The kind of a cluster file's optional header (`apiVersion: elasticgpu.io/v1alpha1`).
CLUSTER_KIND = "SandboxCluster"


@dataclass(frozen=True)
class NodeGroup:
    """`count` identical fake nodes named <name>-000, <name>-001, ..., published with
    `agent_config` (None: `FAKE_NODE_AGENT_CONFIG`)."""

    name: str
    count: int
    gpus: int
    model: str = DEFAULT_GPU_MODEL
    memory_mib: int = DEFAULT_GPU_MEMORY_MIB
    #: MIG instances carved on every card, in order (e.g. ("3g.40gb", "3g.40gb")).
    mig: tuple[MigProfile, ...] = ()
    agent_config: AgentConfig | None = None
    #: >1: each of the `gpus` cards is a board of this many chips (IX BI-V150: 2), each chip
    #: with `memory_mib`; the agent's `splitBoard` decides whether a board is one device or
    #: one per chip.
    chips_per_board: int = 1
    #: "dra": the nodes serve their cards through DRA (label elasticgpu.io/gpu-mode: dra)
    gpu_mode: str = GpuMode.DEVICE_PLUGIN.value
    #: the nodes opt in to dynamic MIG (label elasticgpu.io/mig-dynamic=true): the mig-dynamic
    #: controller may carve and merge back their cards, allocation-sync applies the layouts
    mig_dynamic: bool = False

    def inventories(self) -> list[Node]:
        width = max(3, len(str(self.count - 1)))
        out = []
        for i in range(self.count):
            node = f"{self.name}-{i:0{width}d}"
            if self.chips_per_board > 1:
                out.append(fake_inventory(node, gpus=self.gpus, gpu_model=self.model,
                                          gpu_memory_mib=self.memory_mib,
                                          chips_per_board=self.chips_per_board))
                continue
            cards = []
            starts = layout_starts(self.model, self.mig)
            for c in range(self.gpus):
                instances = [MigInstance(profile, f"MIG-fake-{node}-{c}-{k}", start)
                             for k, (profile, start) in enumerate(zip(self.mig, starts,
                                                                      strict=True))]
                cards.append(Card(c, f"GPU-fake-{node}-{c}", self.model, self.memory_mib,
                                  mig=tuple(instances)))
            labels = {MIG_DYNAMIC_LABEL: "true"} if self.mig_dynamic else {}
            out.append(Node(node, DEFAULT_CPU_MILLI, DEFAULT_MEMORY_MIB, tuple(cards),
                            labels=labels))
        if self.gpu_mode == GpuMode.DRA:
            out = [as_dra(inv) for inv in out]
        return out


def _int(where: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ClusterSpecError(f"{where}={value!r}: must be a whole number {low}-{high} "
                               "(written as a YAML number)")
    return value


def parse_cluster(data: Any, source: str = "cluster file") -> list[NodeGroup]:
    """The sandbox's cluster file: `{nodeGroups: [{name, count, gpus, model, memoryMiB,
    chipsPerBoard, mig, agentConfig}]}`; strict (unknown keys, strings for numbers and
    duplicate names are errors naming the field)."""
    if not isinstance(data, Mapping) or set(data) != {"nodeGroups"}:
        got = sorted(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
        raise ClusterSpecError(f"{source}: must be a mapping with exactly one key, nodeGroups "
                               f"(a list of node groups); got {got}")
    raw_groups = data["nodeGroups"]
    if not isinstance(raw_groups, list) or not raw_groups:
        raise ClusterSpecError(f"{source}: nodeGroups={raw_groups!r}: must be a non-empty list")
    groups: list[NodeGroup] = []
    for i, raw in enumerate(raw_groups):
        where = f"{source}: nodeGroups[{i}]"
        if not isinstance(raw, Mapping):
            raise ClusterSpecError(f"{where}={raw!r}: must be a mapping")
        unknown = sorted(set(raw) - set(_GROUP_KEYS))
        if unknown:
            raise ClusterSpecError(f"{where}: unknown key(s) {unknown}; known: "
                                   f"{', '.join(_GROUP_KEYS)}")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ClusterSpecError(f"{where}.name={name!r}: must be lowercase letters, digits "
                                   "and '-', 1-42 characters, starting and ending alphanumeric")
        if any(g.name == name for g in groups):
            raise ClusterSpecError(f"{where}.name={name!r}: used by an earlier group")
        where = f"{source}: nodeGroups[{i}] ({name})"
        if "count" not in raw or "gpus" not in raw:
            raise ClusterSpecError(f"{where}: count and gpus are required")
        count = _int(f"{where}.count", raw["count"], 1, 5000)
        gpus = _int(f"{where}.gpus", raw["gpus"], 0, 64)
        model = raw.get("model", DEFAULT_GPU_MODEL)
        if not isinstance(model, str) or not model.strip():
            raise ClusterSpecError(f"{where}.model={model!r}: must be a non-empty string")
        memory = _int(f"{where}.memoryMiB", raw.get("memoryMiB", DEFAULT_GPU_MEMORY_MIB),
                      1, 1 << 24)
        chips = _int(f"{where}.chipsPerBoard", raw.get("chipsPerBoard", 1), 1, MAX_CHIPS_PER_BOARD)
        if gpus * chips > MAX_CHIPS_PER_NODE:
            raise ClusterSpecError(f"{where}.chipsPerBoard={chips}: gpus x chipsPerBoard = "
                                   f"{gpus * chips} chips; at most {MAX_CHIPS_PER_NODE} per node")
        mig_raw = raw.get("mig", [])
        if not isinstance(mig_raw, list):
            raise ClusterSpecError(f"{where}.mig={mig_raw!r}: must be a list of MIG profiles "
                                   "carved on every card, e.g. [3g.40gb, 3g.40gb]")
        profiles = []
        for k, text in enumerate(mig_raw):
            try:
                profiles.append(MigProfile.parse(text if isinstance(text, str) else ""))
            except ResourceError as err:
                raise ClusterSpecError(f"{where}.mig[{k}]={text!r}: {err.rule}") from None
        slices = min((card_slices(model.strip(), p) for p in profiles), default=0)
        if sum(p.slices for p in profiles) > slices:
            raise ClusterSpecError(f"{where}.mig={mig_raw!r}: more than {slices} compute "
                                   f"slices on one {model.strip()} card")
        try:
            layout_starts(model.strip(), profiles)
        except ValueError as err:
            raise ClusterSpecError(f"{where}.mig={mig_raw!r}: {err}") from None
        if profiles and chips > 1:
            raise ClusterSpecError(f"{where}.mig={mig_raw!r}: MIG instances are carved on "
                                   f"single-chip cards only, not on boards of chipsPerBoard={chips} "
                                   "chips (leave out mig, or set chipsPerBoard: 1)")
        config = None
        if "agentConfig" in raw:
            raw_config = raw["agentConfig"]
            if not isinstance(raw_config, Mapping):
                raise ClusterSpecError(f"{where}.agentConfig={raw_config!r}: must be a mapping "
                                       "(the agent's config file, see docs/agent.md)")
            try:
                config = as_agent_config(raw_config, f"{where}.agentConfig")
            except ConfigError as err:
                raise ClusterSpecError(str(err)) from None
        mode = raw.get("gpuMode", GPU_MODES[0])
        if mode not in GPU_MODES:
            raise ClusterSpecError(f"{where}.gpuMode={mode!r}: must be one of "
                                   f"{', '.join(GPU_MODES)}")
        dynamic = raw.get("migDynamic", False)
        if not isinstance(dynamic, bool):
            raise ClusterSpecError(f"{where}.migDynamic={dynamic!r}: must be true or false")
        if dynamic and (mig_model(model.strip()) is None or chips > 1):
            raise ClusterSpecError(
                f"{where}.migDynamic=true: dynamic MIG needs single-chip cards of a MIG model "
                f"({', '.join(m.name for m in MIG_MODELS)})")
        groups.append(NodeGroup(name, count, gpus, model.strip(), memory, tuple(profiles),
                                config, chips, mode, dynamic))
    return groups


def load_cluster(path: Path) -> list[NodeGroup]:
    """Read a cluster file with the one settings loader (`api.config.loader.read_file`: YAML 1.2
    scalars, no aliases, bounded nesting and numbers, string keys, UTF-8), so an `agentConfig`
    means in the cluster file what it means in the agent's own file; the optional header is
    `apiVersion: elasticgpu.io/v1alpha1`, `kind: SandboxCluster`."""
    try:
        data = read_file(path)
    except ConfigError as err:
        raise ClusterSpecError(str(err)) from None
    if isinstance(data, Mapping):
        problems = header_problems(data, CLUSTER_KIND)
        if problems:
            raise ClusterSpecError(f"{path}: invalid {CLUSTER_KIND}:\n"
                                   + "\n".join(p.line() for p in problems))
        data = without_header(data)
    return parse_cluster(data, str(path))
