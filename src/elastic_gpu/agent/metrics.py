"""The agent's Prometheus metrics (`elasticgpu_agent_*`, docs/metrics.md): each card of this
node as the agent sees it (capacity, health, what its pods hold) and what each container
holds, plus Allocate's outcomes.

Values are read at scrape time: the cards from the agent's snapshot (health follows the
backend's events), the holdings from the node's pods by the same pure `accounting` functions
that write the GPUDevice allocation columns, so a scrape and `kubectl get gpudevices` agree.
Units: compute in milli-cards (1000 = one card), memory in bytes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from elastic_gpu.agent.accounting import ContainerShare, card_usage, container_shares
from elastic_gpu.core.model import Card

log = logging.getLogger(__name__)

MIB = 1 << 20
PREFIX = "elasticgpu_agent_"
CARD_LABELS = ["node", "device_index", "device_uuid", "model"]
CONTAINER_LABELS = ["namespace", "pod", "container", "node", "device_index", "device_uuid",
                    "model"]


def card_families(node: str, cards: Sequence[Card],
                  pods: Sequence[Mapping[str, Any]] | None) -> Iterator[GaugeMetricFamily]:
    """Per card: capacity and health always; allocation per card and per container when the
    node's pods are known (`pods` None: the agent runs without the API)."""
    capacity = GaugeMetricFamily(PREFIX + "card_compute_capacity_millicards",
                                 "Compute of a card, milli-cards (1000 = one card)",
                                 labels=CARD_LABELS)
    memory_capacity = GaugeMetricFamily(PREFIX + "card_memory_capacity_bytes",
                                        "Memory of a card, bytes", labels=CARD_LABELS)
    healthy = GaugeMetricFamily(PREFIX + "card_healthy",
                                "1 if the card is healthy, 0 if the backend reported it "
                                "unhealthy (its devices are advertised unhealthy to kubelet)",
                                labels=CARD_LABELS)
    allocated = GaugeMetricFamily(PREFIX + "card_compute_allocated_millicards",
                                  "Compute that the pods on this node hold of a card (their "
                                  "assignments), milli-cards", labels=CARD_LABELS)
    memory = GaugeMetricFamily(PREFIX + "card_memory_allocated_bytes",
                               "Card memory that the pods on this node hold, bytes",
                               labels=CARD_LABELS)
    per_container = GaugeMetricFamily(PREFIX + "container_compute_allocated_millicards",
                                      "Compute a container holds on a card, milli-cards",
                                      labels=CONTAINER_LABELS)
    per_container_memory = GaugeMetricFamily(PREFIX + "container_memory_allocated_bytes",
                                             "Card memory a container holds, bytes",
                                             labels=CONTAINER_LABELS)
    by_index = {card.index: card for card in cards}
    usage = card_usage(pods, node, by_index) if pods is not None else {}
    for card in cards:
        labels = [node, str(card.index), card.uuid, card.model]
        capacity.add_metric(labels, card.compute_milli)
        memory_capacity.add_metric(labels, card.memory_mib * MIB)
        healthy.add_metric(labels, 1 if card.healthy else 0)
        if pods is not None:
            use = usage.get(card.index)
            allocated.add_metric(labels, use.milli if use else 0)
            memory.add_metric(labels, use.memory_mib * MIB if use else 0)
    shares: list[ContainerShare] = (container_shares(pods, node, by_index)
                                    if pods is not None else [])
    for share in shares:
        held = by_index.get(share.index)
        labels = [share.namespace, share.pod, share.container, node, str(share.index),
                  share.uuid, held.model if held else ""]
        per_container.add_metric(labels, share.milli)
        per_container_memory.add_metric(labels, share.memory_mib * MIB)
    yield from (capacity, memory_capacity, healthy, allocated, memory, per_container,
                per_container_memory)


def allocate_family(outcomes: Mapping[tuple[str, str], int]) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + "allocations",
                                 "Allocate calls from kubelet, by resource and result (served; "
                                 "refused: kubelet fails that container's admission)",
                                 labels=["resource", "result"])
    for (resource, result), count in sorted(outcomes.items()):
        family.add_metric([resource, result], count)
    return family


class _AgentCollector(Collector):
    def __init__(self, node: str, cards: Callable[[], Sequence[Card]],
                 pods: Callable[[], Sequence[Mapping[str, Any]]] | None,
                 outcomes: Callable[[], Counter[tuple[str, str]]]) -> None:
        self._node = node
        self._cards = cards
        self._pods = pods
        self._outcomes = outcomes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        pods = None
        if self._pods is not None:
            try:
                pods = self._pods()
            except Exception as err:  # the API is down: cards and health still count
                log.warning("metrics: cannot read this node's pods: %s", err)
        yield from card_families(self._node, self._cards(), pods)
        yield allocate_family(self._outcomes())


def agent_registry(node: str, cards: Callable[[], Sequence[Card]],
                   pods: Callable[[], Sequence[Mapping[str, Any]]] | None,
                   outcomes: Callable[[], Counter[tuple[str, str]]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_AgentCollector(node, cards, pods, outcomes))
    return registry


class MpsDaemonCollector(Collector):
    """`elasticgpu_agent_mps_daemon_up`: per card (chip) UUID, 1 while the MPS control daemon
    the agent supervises runs (agent/mps_supervisor.py), 0 while it is down."""

    def __init__(self, node: str, up: Callable[[], Mapping[str, bool]]) -> None:
        self._node = node
        self._up = up

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(PREFIX + "mps_daemon_up",
                                   "1 if the MPS control daemon the agent runs for this card "
                                   "is up, 0 while it is down (Allocate on the card is refused)",
                                   labels=["node", "device_uuid"])
        for uuid, up in sorted(self._up().items()):
            family.add_metric([self._node, uuid], 1 if up else 0)
        yield family
