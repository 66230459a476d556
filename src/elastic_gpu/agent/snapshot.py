"""What a node offers right now (`NodeSnapshot`): its logical cards, the resources planned
over them, what each card backs and the Node's GPU capacity. Both node modes start from it
(`agent.nodemode`); the device-plugin mode publishes it as GPUDevices, the DRA mode plans no
device-plugin resources (`plans=()`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from elastic_gpu.agent.backends.base import Backend
from elastic_gpu.agent.config import AgentConfig, MigStrategy
from elastic_gpu.agent.devices import (
    LogicalCard,
    ResourcePlan,
    build_plans,
    logical_cards,
    node_capacity,
    status_only_resources,
)
from elastic_gpu.core.model import Node
from elastic_gpu.core.resources import lookup


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
