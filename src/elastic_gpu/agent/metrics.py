"""The agent's Prometheus metrics (`elasticgpu_agent_*`, docs/metrics.md): each card of this
node as the agent sees it (capacity, health, what its pods hold) and what each container
holds, plus Allocate's outcomes.

Values are read at scrape time: the cards from the agent's snapshot (health follows the
backend's events), the holdings from the node's pods by the same pure `accounting` functions
that write the GPUDevice allocation columns, so a scrape and `kubectl get gpudevices` agree.
Units: compute in milli-cards (1000 = one card), memory in bytes.

The same families serve many nodes from one endpoint (`nodes_registry`: the sandbox's kwok
nodes, sampled by `allocation-sync`): each node's series carry its `node` label, and
`merge_families` makes one family per name of them, as a page must have.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elastic_gpu.agent.accounting import ContainerShare, card_usage, container_shares
from elastic_gpu.core.model import Card
from elastic_gpu.core.usage import CardUsage, MigUsage, OverShare

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


def usage_families(node: str, cards: Sequence[Card], usage: Mapping[int, CardUsage],
                   over: Sequence[OverShare], writes: int = 0,
                   mig: Mapping[str, MigUsage] | None = None
                   ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """What the newest sample observed (docs/agent.md "Observed usage"): per card and per
    holder, memory used and SM utilisation (a ratio, 0..1), out-of-band memory per card, and
    1 for each holder above its memory share. Cards not sampled (yet) have no series."""
    card_memory = GaugeMetricFamily(PREFIX + "card_gpu_memory_used_bytes",
                                    "Card memory in use by every process, observed, bytes",
                                    labels=CARD_LABELS)
    card_sm = GaugeMetricFamily(PREFIX + "card_gpu_sm_utilization_ratio",
                                "Share of the card's SM time in use, observed (0..1)",
                                labels=CARD_LABELS)
    out_of_band = GaugeMetricFamily(PREFIX + "card_out_of_band_memory_bytes",
                                    "Card memory no pod holding the card accounts for (other "
                                    "processes, leaked contexts), observed, bytes",
                                    labels=CARD_LABELS)
    memory = GaugeMetricFamily(PREFIX + "container_gpu_memory_used_bytes",
                               "Card memory a holder's processes use, observed, bytes",
                               labels=CONTAINER_LABELS)
    sm = GaugeMetricFamily(PREFIX + "container_gpu_sm_utilization_ratio",
                           "Share of the card's SM time a holder's processes use, observed "
                           "(0..1; absent where the backend cannot sample per process)",
                           labels=CONTAINER_LABELS)
    over_share = GaugeMetricFamily(PREFIX + "container_over_share",
                                   "1 while a holder uses more card memory than its share",
                                   labels=CONTAINER_LABELS)
    by_index = {card.index: card for card in cards}
    for index, use in sorted(usage.items()):
        card = by_index.get(index)
        if card is None:
            continue
        labels = [node, str(index), card.uuid, card.model]
        card_memory.add_metric(labels, use.used_mib * MIB)
        card_sm.add_metric(labels, use.sm_percent / 100)
        out_of_band.add_metric(labels, use.out_of_band_mib * MIB)
        for c in use.containers:
            held = [c.namespace, c.pod, c.container, *labels]
            memory.add_metric(held, c.memory_mib * MIB)
            if c.sm_percent is not None:
                sm.add_metric(held, c.sm_percent / 100)
    for item in over:
        card = by_index.get(item.card)
        if card is not None:
            over_share.add_metric([item.ref.namespace, item.ref.pod, item.ref.container, node,
                                   str(item.card), card.uuid, card.model], 1)
    written = CounterMetricFamily(PREFIX + "usage_writes",
                                  "GPUDevice status.usage writes of this node's agent (the "
                                  "write period's rate limit, docs/agent.md)", labels=["node"])
    written.add_metric([node], writes)
    mig_memory = GaugeMetricFamily(
        PREFIX + "mig_gpu_memory_used_bytes",
        "Memory in use on a MIG instance, observed, bytes (NVML has no utilisation per MIG "
        "instance)", labels=[*CARD_LABELS, "mig_uuid", "profile"])
    for mig_uuid, instance in sorted((mig or {}).items()):
        card = by_index.get(instance.card)
        if card is None:
            continue
        profile = next((m.profile.name for m in card.mig if m.uuid == mig_uuid), "")
        mig_memory.add_metric([node, str(instance.card), card.uuid, card.model, mig_uuid,
                               profile], instance.used_mib * MIB)
    yield from (card_memory, card_sm, out_of_band, memory, sm, over_share, written, mig_memory)


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
                 outcomes: Callable[[], Counter[tuple[str, str]]],
                 usage: Callable[[], tuple[Mapping[int, CardUsage], Sequence[OverShare], int,
                                   Mapping[str, MigUsage]]]
                 | None = None) -> None:
        self._usage = usage
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
        cards = self._cards()
        yield from card_families(self._node, cards, pods)
        if self._usage is not None:
            yield from usage_families(self._node, cards, *self._usage())
        yield allocate_family(self._outcomes())


def agent_registry(node: str, cards: Callable[[], Sequence[Card]],
                   pods: Callable[[], Sequence[Mapping[str, Any]]] | None,
                   outcomes: Callable[[], Counter[tuple[str, str]]],
                   usage: Callable[[], tuple[Mapping[int, CardUsage], Sequence[OverShare],
                                             int, Mapping[str, MigUsage]]] | None = None
                   ) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_AgentCollector(node, cards, pods, outcomes, usage))
    return registry


@dataclass(frozen=True)
class NodeMetrics:
    """One node's inputs to the card and usage families: its cards, the pods bound to it and
    its newest usage sample (`UsageMonitor.view`, `writes`)."""

    node: str
    cards: Sequence[Card]
    pods: Sequence[Mapping[str, Any]]
    usage: Mapping[int, CardUsage] = field(default_factory=dict)
    over: Sequence[OverShare] = ()
    writes: int = 0
    mig: Mapping[str, MigUsage] = field(default_factory=dict)


def merge_families(families: Iterable[Metric]) -> list[Metric]:
    """One family per name, its samples those of every family of that name in order (the
    exposition format allows a name's HELP and TYPE once per page), in first-seen order."""
    merged: dict[str, Metric] = {}
    for family in families:
        into = merged.get(family.name)
        if into is None:
            into = merged[family.name] = Metric(family.name, family.documentation,
                                                family.type, family.unit)
        elif into.type != family.type:
            raise ValueError(f"{family.name}: a {family.type} and a {into.type} of one name")
        into.samples.extend(family.samples)
    return list(merged.values())


def nodes_families(nodes: Iterable[NodeMetrics]) -> list[Metric]:
    """The agent's card and usage families for several nodes on one page (no Allocate
    outcomes: no kubelet calls these nodes' device plugins)."""
    return merge_families(
        family for n in nodes
        for family in (*card_families(n.node, n.cards, n.pods),
                       *usage_families(n.node, n.cards, n.usage, n.over, n.writes, n.mig)))


class _NodesCollector(Collector):
    def __init__(self, nodes: Callable[[], Sequence[NodeMetrics]]) -> None:
        self._nodes = nodes

    def collect(self) -> Iterator[Metric]:
        nodes = self._nodes()
        yield from nodes_families(nodes)
        if nodes:
            # the sandbox's kwok nodes serve the agent's whole page: their fake cards change
            # MIG mode at once (the fake backend), so no mode change ever waits for a reset
            yield mig_pending_reset_family(
                (n.node, card, False) for n in nodes for card in n.cards)


def nodes_registry(nodes: Callable[[], Sequence[NodeMetrics]]) -> CollectorRegistry:
    """A registry serving `nodes()`'s nodes, read at each scrape."""
    registry = CollectorRegistry()
    registry.register(_NodesCollector(nodes))
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


class MigPendingResetCollector(Collector):
    """`elasticgpu_agent_mig_pending_reset`: per card of the node, 1 while the MIG applier's
    mode change on it waits for a GPU reset the operator does (`MigApplier.pending_reset`,
    a MigLayout in phase `PendingReset`), else 0."""

    def __init__(self, node: str, cards: Callable[[], Sequence[Card]],
                 pending: Callable[[], frozenset[str]]) -> None:
        self._node = node
        self._cards = cards
        self._pending = pending

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending = self._pending()
        yield mig_pending_reset_family(
            (self._node, card, card.uuid in pending)
            for card in sorted(self._cards(), key=lambda c: c.index))


def mig_pending_reset_family(cards: Iterable[tuple[str, Card, bool]]) -> GaugeMetricFamily:
    """`elasticgpu_agent_mig_pending_reset` of (node, card, pending) triples."""
    family = GaugeMetricFamily(PREFIX + "mig_pending_reset",
                               "1 while the card's MIG mode change waits for a GPU reset "
                               "(nvidia-smi -r when idle; its MigLayout is PendingReset)",
                               labels=CARD_LABELS)
    for node, card, pending in cards:
        family.add_metric([node, str(card.index), card.uuid, card.model], 1 if pending else 0)
    return family
