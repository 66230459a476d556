"""From physical cards to what the node offers: logical cards and one device list per resource.

Pure functions, the same for every backend:
- `logical_cards`: a multi-chip board is one card (its chips handed out together) unless
  `splitBoard`, when each chip is a card of its own (the IX plugin's behaviour);
- `build_plans`: the kubelet devices of each advertised resource: whole cards (or
  `timeSlicing.replicas` replicas of each), MIG instances by strategy, one device per
  percent of compute for share resources, one per unit of memory where that stays small,
  one per TFLOPS of a card whose model the TFLOPS table knows (`core.tflops`);
- `node_capacity`: the counts the Node object advertises (capacity and, healthy only,
  allocatable), including resources too fine-grained for a device plugin and the node-level
  GPU count kube-scheduler reads (`core.nodefit.NODE_CORE`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from elastic_gpu.agent.config import AgentConfig, MigStrategy
from elastic_gpu.core.model import LINK_WEIGHT, Card, Health, Link, LinkKind
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.nodefit import node_capacity as node_core_capacity
from elastic_gpu.core.resources import MILLI_PER_CARD, lookup
from elastic_gpu.core.tflops import advertised_tflops

MAX_DEVICE_ID = 63


class InventoryError(ValueError):
    """The discovered devices cannot be offered as configured (e.g. MIG `single` on a mix)."""


@dataclass(frozen=True)
class LogicalCard:
    """A card as the cluster sees it, and the physical cards (chips) behind it."""

    card: Card
    chips: tuple[Card, ...]

    @property
    def index(self) -> int:
        return self.card.index

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(chip.uuid for chip in self.chips)


def _best_link(links: Iterable[Link]) -> Link | None:
    return max(links, key=lambda link: link.weight, default=None)


def logical_cards(physical: Sequence[Card], split_board: bool) -> tuple[LogicalCard, ...]:
    """Group board chips unless split; a logical card keeps its first chip's index."""
    groups: dict[str, list[Card]] = {}
    order: list[list[Card]] = []
    for card in sorted(physical, key=lambda c: c.index):
        if card.board is None or split_board:
            order.append([card])
        elif card.board in groups:
            groups[card.board].append(card)
        else:
            groups[card.board] = [card]
            order.append(groups[card.board])
    owner = {chip.index: group[0].index for group in order for chip in group}
    result = []
    for group in order:
        first = group[0]
        # Links to other logical cards: the best physical link from any chip of this group.
        by_peer: dict[int, list[Link]] = {}
        for chip in group:
            for link in chip.links:
                peer = owner.get(link.peer)
                if peer is not None and peer != first.index:
                    by_peer.setdefault(peer, []).append(Link(peer, link.kind, link.count))
        links = tuple(best for peer in sorted(by_peer)
                      if (best := _best_link(by_peer[peer])) is not None)
        if len(group) == 1:
            card = Card(first.index, first.uuid, first.model, first.memory_mib, first.compute_milli,
                        first.health, links, first.mig, first.numa_node, first.board,
                        mig_mode=first.mig_mode)
        else:
            health = (Health.HEALTHY if all(chip.healthy for chip in group) else Health.UNHEALTHY)
            card = Card(first.index, first.board or first.uuid, first.model,
                        sum(chip.memory_mib for chip in group), MILLI_PER_CARD, health, links, (),
                        first.numa_node, first.board)
        result.append(LogicalCard(card, tuple(group)))
    return tuple(result)


class PluginKind(enum.Enum):
    WHOLE = "whole"  # one device per card, handed out as the scheduler assigned
    REPLICA = "replica"  # time-sliced replicas; kubelet's choice of IDs is the allocation
    SHARE = "share"  # one device per percent of a card's compute
    MEMORY = "memory"  # one device per unit of card memory
    #: one device per TFLOPS of the card's model; the share is the scheduler's (the
    #: assignment records the milli it computed for this card's model)
    TFLOPS = "tflops"
    MIG = "mig"  # one device per MIG instance


@dataclass(frozen=True)
class DeviceUnit:
    """One kubelet device: its ID and the logical card it is part of."""

    id: str
    card: int
    numa_node: int | None = None
    mig_uuid: str | None = None


@dataclass(frozen=True)
class ResourcePlan:
    resource: str
    kind: PluginKind
    devices: tuple[DeviceUnit, ...]

    @property
    def kubelet_chooses(self) -> bool:
        """Time-sliced replicas oversubscribe on purpose, so the IDs kubelet picked are the
        allocation; every other kind gives the container what the scheduler assigned."""
        return self.kind is PluginKind.REPLICA

    def by_id(self) -> dict[str, DeviceUnit]:
        return {unit.id: unit for unit in self.devices}


def _card_id(card: Card) -> str:
    return card.uuid if len(card.uuid) <= MAX_DEVICE_ID - 4 else f"gpu{card.index}"


def _whole_devices(cards: Sequence[LogicalCard], replicas: int) -> tuple[DeviceUnit, ...]:
    units = []
    for lc in cards:
        base = _card_id(lc.card)
        for replica in range(replicas):
            unit_id = base if replicas == 1 else f"{base}::{replica}"
            units.append(DeviceUnit(unit_id, lc.index, lc.card.numa_node))
    return tuple(units)


def build_plans(cards: Sequence[LogicalCard], config: AgentConfig) -> list[ResourcePlan]:
    """Every resource this node serves through a device plugin, with its devices."""
    replicas = config.timeSlicing.replicas
    whole_kind = PluginKind.REPLICA if replicas > 1 else PluginKind.WHOLE
    gpu_name = config.time_sliced_resource
    strategy = config.migStrategy
    mig_cards = [lc for lc in cards if lc.card.mig_enabled] if strategy is not MigStrategy.NONE else []
    plain = [lc for lc in cards if lc not in mig_cards]
    plans: list[ResourcePlan] = []
    if strategy is MigStrategy.SINGLE and mig_cards:
        if plain:
            raise InventoryError(
                "migStrategy single needs MIG enabled on every card; cards "
                f"{[lc.index for lc in plain]} have none (use migStrategy mixed)")
        profiles = {inst.profile.name for lc in mig_cards for inst in lc.card.mig}
        if len(profiles) != 1:
            raise InventoryError(f"migStrategy single needs one MIG profile on all cards, found "
                                 f"{sorted(profiles)} (use migStrategy mixed)")
        units = tuple(DeviceUnit(inst.uuid if replicas == 1 else f"{inst.uuid}::{r}", lc.index,
                                 lc.card.numa_node, inst.uuid)
                      for lc in mig_cards for inst in lc.card.mig for r in range(replicas))
        plans.append(ResourcePlan(gpu_name, whole_kind, units))
    else:
        if plain:
            plans.append(ResourcePlan(gpu_name, whole_kind, _whole_devices(plain, replicas)))
        by_profile: dict[str, list[DeviceUnit]] = {}
        for lc in mig_cards:
            for inst in lc.card.mig:
                by_profile.setdefault(inst.profile.resource_name, []).append(
                    DeviceUnit(inst.uuid, lc.index, lc.card.numa_node, inst.uuid))
        plans.extend(ResourcePlan(name, PluginKind.MIG, tuple(units))
                     for name, units in sorted(by_profile.items()))
    # Shares are sold from cards that are not carved into MIG instances.
    share_cards = plain if strategy is not MigStrategy.NONE else list(cards)
    for name in config.resources.share:
        spec = lookup(name)
        assert spec is not None  # validated by the config
        per_card = MILLI_PER_CARD // spec.scale
        plans.append(ResourcePlan(name, PluginKind.SHARE, tuple(
            DeviceUnit(f"{lc.index}-{k}", lc.index, lc.card.numa_node)
            for lc in share_cards for k in range(per_card * lc.card.compute_milli // MILLI_PER_CARD))))
    for name in config.resources.memory:
        units_per_card = {lc.index: lc.card.memory_mib // _scale(name) for lc in share_cards}
        if all(n <= config.resources.maxDevicesPerCard for n in units_per_card.values()):
            plans.append(ResourcePlan(name, PluginKind.MEMORY, tuple(
                DeviceUnit(f"{lc.index}-m{k}", lc.index, lc.card.numa_node)
                for lc in share_cards for k in range(units_per_card[lc.index]))))
    # TFLOPS are a device plugin whatever their count (under 1,000 per card in the table):
    # kubelet calls Allocate only for device-plugin resources, and Allocate hands out the card.
    for name in config.resources.tflops:
        plans.append(ResourcePlan(name, PluginKind.TFLOPS, tuple(
            DeviceUnit(f"{lc.index}-t{k}", lc.index, lc.card.numa_node)
            for lc in share_cards
            for k in range(advertised_tflops(lc.card.model, lc.card.compute_milli)))))
    return [plan for plan in plans if plan.devices]


def _scale(name: str) -> int:
    spec = lookup(name)
    assert spec is not None
    return spec.scale


def status_only_resources(cards: Sequence[LogicalCard], config: AgentConfig,
                          plans: Sequence[ResourcePlan]) -> dict[str, tuple[int, int]]:
    """Memory resources too fine-grained for a device plugin: (capacity, allocatable).

    elasticgpu.io/gpu-memory is in MiB: 81,920 devices per 80 GB card would make every
    ListAndWatch message megabytes. Such resources are advertised in the Node's status only;
    kubelet keeps extended resources it does not manage, and counts them at admission.
    """
    served = {plan.resource for plan in plans}
    share_cards = [lc for lc in cards
                   if config.migStrategy is MigStrategy.NONE or not lc.card.mig_enabled]
    out = {}
    for name in config.resources.memory:
        if name in served:
            continue
        scale = _scale(name)
        out[name] = (sum(lc.card.memory_mib // scale for lc in share_cards),
                     sum(lc.card.memory_mib // scale for lc in share_cards if lc.card.healthy))
    return out


def unit_health(unit: DeviceUnit, health: Mapping[int, Health]) -> Health:
    return health.get(unit.card, Health.UNHEALTHY)


def node_capacity(cards: Sequence[LogicalCard], config: AgentConfig,
                  plans: Sequence[ResourcePlan]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) for the GPU resources, as kubelet would compute them."""
    health = {lc.index: lc.card.health for lc in cards}
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    for plan in plans:
        capacity[plan.resource] = str(len(plan.devices))
        allocatable[plan.resource] = str(sum(1 for u in plan.devices
                                             if unit_health(u, health) is Health.HEALTHY))
    for name, (cap, alloc) in status_only_resources(cards, config, plans).items():
        capacity[name] = str(cap)
        allocatable[name] = str(alloc)
    if cards:
        # kube-scheduler's node-level GPU count (core/nodefit.py): allocatable = capacity
        # whatever the health, a lower bound of what the extender lets pods hold.
        replicas = {lc.index: 1 for lc in cards}
        for plan in plans:
            if plan.kind is PluginKind.REPLICA:
                per_card: dict[int, int] = {}
                for unit in plan.devices:
                    per_card[unit.card] = per_card.get(unit.card, 0) + 1
                for card, count in per_card.items():
                    replicas[card] = max(replicas.get(card, 1), count)
        capacity[NODE_CORE] = allocatable[NODE_CORE] = str(node_core_capacity(replicas.values()))
    return capacity, allocatable


def preferred(available: Sequence[str], must_include: Sequence[str], size: int,
              units: Mapping[str, DeviceUnit], cards: Mapping[int, Card]) -> list[str]:
    """Topology-aware choice of `size` device IDs: must-include first, then grow the set by
    the device whose card is best linked to the cards already chosen (NVLink over board over
    PCIe switch ...), preferring devices of cards already chosen (shares stay on one card),
    then the same NUMA node, then the lowest card index for determinism."""
    chosen = [d for d in must_include if d in units]
    pool = [d for d in available if d in units and d not in chosen]

    def link_weight(a: int, b: int) -> int:
        if a == b:
            return 10 * LINK_WEIGHT[LinkKind.NVLINK] * 64
        card = cards.get(a)
        if card is None:
            return 0
        return max((link.weight for link in card.links if link.peer == b), default=0)

    while len(chosen) < size and pool:
        chosen_cards = [units[d].card for d in chosen]
        numa = {units[d].numa_node for d in chosen}

        def score(device: str, chosen_cards: list[int] = chosen_cards,
                  numa: set[int | None] = numa) -> tuple[int, int, int, int]:
            unit = units[device]
            weight = sum(link_weight(c, unit.card) for c in chosen_cards)
            return (weight, int(unit.numa_node in numa), -unit.card, -pool.index(device))

        if chosen:
            best = max(pool, key=score)
        else:
            # Start where the best-connected group is: the card with the heaviest links to
            # the other cards still available.
            pool_cards = {units[d].card for d in pool}
            best = max(pool, key=lambda d: (_heft(cards.get(units[d].card), pool_cards),
                                            -units[d].card, -pool.index(d)))
        chosen.append(best)
        pool.remove(best)
    return chosen[:size]


def _heft(card: Card | None, among: set[int]) -> int:
    if card is None:
        return 0
    return sum(link.weight for link in card.links if link.peer in among)
