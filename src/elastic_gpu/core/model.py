"""GPU inventory: nodes, cards, links between cards, MIG instances.

Plain immutable values. The agent builds them from a backend (NVML, a multi-chip board, a
fake YAML), publishes them to the API, and the scheduler and simulator read them back; the
engine turns a list of nodes into arrays once and works on those.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from elastic_gpu.core.resources import MILLI_PER_CARD, Measure, MigProfile, lookup
from elastic_gpu.core.usage import CardUsage


class LinkKind(enum.Enum):
    """How two cards of a node talk; ordered from fastest to slowest."""

    NVLINK = "nvlink"
    SAME_BOARD = "board"  # two chips of one multi-chip board
    PCIE_SWITCH = "pcie-switch"  # behind one PCIe switch
    NUMA = "numa"  # same NUMA node, through the host bridge
    SYSTEM = "system"  # across sockets


#: Relative bandwidth weight of a link kind, used by topology-aware card choice.
LINK_WEIGHT: Mapping[LinkKind, int] = {
    LinkKind.NVLINK: 100,
    LinkKind.SAME_BOARD: 80,
    LinkKind.PCIE_SWITCH: 30,
    LinkKind.NUMA: 20,
    LinkKind.SYSTEM: 10,
}


@dataclass(frozen=True)
class Link:
    """A link from the owning card to the card with index `peer`."""

    peer: int
    kind: LinkKind
    #: NVLink lane count (or 1 for other kinds); more lanes, more bandwidth.
    count: int = 1

    @property
    def weight(self) -> int:
        return LINK_WEIGHT[self.kind] * max(self.count, 1)


class Health(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    #: healthy, but fenced while its MIG layout changes (the GPUDevice's `status.fence`,
    #: docs/mig-apply.md): nothing new is placed on it or its instances until the fence goes
    FENCED = "Fenced"


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance carved out of a card."""

    profile: MigProfile
    uuid: str
    #: The placement slot it starts at (NVML's GPU instance placement start: slots are the
    #: card's memory slices, `core.mig.layout`); it spans its profile's memory slices.
    start: int = 0
    health: Health = Health.HEALTHY


@dataclass(frozen=True)
class MigMode:
    """A MIG-capable card's MIG mode as its driver reports it (`nvmlDeviceGetMigMode`):
    `current` is in force now, `pending` after the next GPU reset (they differ while a change
    waits for one: an A100 or A30 with a process or daemon on it, docs/mig-apply.md)."""

    current: bool
    pending: bool

    @property
    def waits_for_reset(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True)
class Card:
    """One GPU (or one chip of a split multi-chip board)."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_milli: int = MILLI_PER_CARD
    health: Health = Health.HEALTHY
    links: tuple[Link, ...] = ()
    mig: tuple[MigInstance, ...] = ()
    numa_node: int | None = None
    #: Multi-chip boards: the board's id; chips of one board share it.
    board: str | None = None
    #: What the card backs, as its node's agent advertises it: resource name -> devices of
    #: that resource on this card (e.g. {"iluvatar.com/gpu": 4, "elasticgpu.io/gpu-core": 100}).
    #: None: unknown, the card serves any name (the simulator's trace cards, older agents).
    offers: Mapping[str, int] | None = field(default=None, hash=False)
    #: What the node's agent last observed on the card (memory in use, out-of-band memory,
    #: utilisation); None: nothing observed (the simulator, an agent that does not sample).
    usage: CardUsage | None = None
    #: The card's MIG mode where the backend reads it (NVML on a MIG-capable card); None: no
    #: mode to read (not MIG-capable, the fake backend, a card read back from the API), where
    #: the card is in MIG mode exactly when it has instances.
    mig_mode: MigMode | None = None

    def __post_init__(self) -> None:
        if self.offers is not None:
            object.__setattr__(self, "offers", _frozen_offers(f"card {self.index}", self.offers))
        if self.index < 0:
            raise ValueError(f"card index {self.index} is negative")
        if self.memory_mib <= 0:
            raise ValueError(f"card {self.index} has {self.memory_mib} MiB of memory; must be > 0")
        if not 0 < self.compute_milli <= MILLI_PER_CARD:
            raise ValueError(f"card {self.index} compute {self.compute_milli} not in 1..1000")

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    @property
    def mig_enabled(self) -> bool:
        """In MIG mode: it has instances, or its mode is on with none (it then backs nothing:
        CUDA sees no whole card in MIG mode)."""
        return bool(self.mig) or (self.mig_mode is not None and self.mig_mode.current)


@dataclass(frozen=True)
class Node:
    """A Kubernetes node and its GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    cards: tuple[Card, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The GPU resources the Node object advertises (status.allocatable): a node-level check
    #: for cards whose `offers` are unknown. None: unknown (the simulator).
    offers: Mapping[str, int] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.offers is not None:
            object.__setattr__(self, "offers", _frozen_offers(f"node {self.name}", self.offers))
        indexes = [card.index for card in self.cards]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"node {self.name}: duplicate card indexes {sorted(indexes)}")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"node {self.name}: negative CPU or memory capacity")

    @property
    def gpu_count(self) -> int:
        return len(self.cards)

    @property
    def models(self) -> frozenset[str]:
        return frozenset(card.model for card in self.cards)

    def card(self, index: int) -> Card:
        for card in self.cards:
            if card.index == index:
                return card
        raise KeyError(f"node {self.name} has no card {index}")


def cluster_cpu_per_gpu(nodes: Iterable[Node]) -> float | None:
    """CPU (milli) per milli-card of the nodes that have cards for shares and whole-card
    requests (MIG-enabled cards left out; nodes without such cards do not count): the cluster
    side of the CPU pressure (`workload.cpu_pressure`). None without such cards."""
    cpu = gpu = 0
    for node in nodes:
        milli = sum(card.compute_milli for card in node.cards if not card.mig_enabled)
        if milli:
            cpu += node.cpu_milli
            gpu += milli
    return cpu / gpu if gpu else None


def _frozen_offers(where: str, offers: Mapping[str, int]) -> Mapping[str, int]:
    for name, count in offers.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{where}: offers {name}={count!r}; must be a whole number >= 0")
    return dict(sorted(offers.items()))  # a plain dict: pickles (sim workers); never mutated


#: Measures whose names are Elastic GPU's own shares, whatever alias a pod writes: any card
#: offering one name of the measure serves every name of it (see `offered`).
SHARE_MEASURES = frozenset({Measure.COMPUTE, Measure.MEMORY})


def offered(offers: Mapping[str, int], name: str) -> int:
    """How many devices of the resource `name` these offers hold, under the serving rule:

    - whole-card names (nvidia.com/gpu, iluvatar.com/gpu, elasticgpu.io/gpu) and MIG names are
      a vendor's device plugin: only the very name counts (a node with nvidia.com/gpu does not
      serve iluvatar.com/gpu);
    - compute and memory names (elasticgpu.io/gpu-core, tencent.com/vcuda-core,
      nano-gpu/gpu-percent, gpushare.provisioner.elasticgpu.io/..., tencent.com/vcuda-memory,
      elasticgpu.io/gpu-memory) are aliases of one Elastic GPU share (the resource table):
      the name itself, else the largest count of any offered name of the same measure.
    - a TFLOPS request (elasticgpu.io/gpu-tflops) becomes a compute share of the card it lands
      on (`core.tflops`), but only the very name serves it: kubelet admits the pod only where
      the agent's TFLOPS device plugin advertises it (a card of a model the table knows, the
      agent's `resources.tflops` not empty), and a compute name alone would let the scheduler
      pick a node whose kubelet then fails the pod.
    Names that are not GPU resources are never offered (0)."""
    count = offers.get(name, 0)
    if count > 0:
        return count
    spec = lookup(name)
    if spec is None or spec.measure not in SHARE_MEASURES:
        return 0
    best = 0
    for other, n in offers.items():
        other_spec = lookup(other)
        if other_spec is not None and other_spec.measure is spec.measure:
            best = max(best, n)
    return best


def serves(offers: Mapping[str, int] | None, names: tuple[str, ...] | frozenset[str]) -> bool:
    """Whether a card (or node) with these offers serves every name; None serves anything."""
    return offers is None or all(offered(offers, name) > 0 for name in names)
