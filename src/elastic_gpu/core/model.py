"""GPU inventory: nodes, cards, links between cards, MIG instances.

Plain immutable values. The agent builds them from a backend (NVML, a multi-chip board, a
fake YAML), publishes them to the API, and the scheduler and simulator read them back; the
engine turns a list of nodes into arrays once and works on those.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from elastic_gpu.core.resources import MILLI_PER_CARD, MigProfile


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


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance carved out of a card."""

    profile: MigProfile
    uuid: str
    #: The first compute slice it occupies; with `profile.slices` it gives the placement.
    start: int = 0
    health: Health = Health.HEALTHY


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

    def __post_init__(self) -> None:
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
        return bool(self.mig)


@dataclass(frozen=True)
class Node:
    """A Kubernetes node and its GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    cards: tuple[Card, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
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
