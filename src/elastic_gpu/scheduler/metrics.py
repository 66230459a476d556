"""Prometheus metrics of the extender (`elasticgpu_scheduler_*`, docs/metrics.md): latency and
outcome per verb, bind failures and conflicts, why pods were unschedulable, allocation and
capacity per card, per-pod shares, the CPU and memory the extender believes bound pods ask of
each node, and the wake-up of pending pods (how many wait for GPU capacity, how many were
woken).

Per-card and per-pod values are collected at scrape time from the engine (no cost on the hot
path) and written as text by `_StateText` (docs/metrics.md, "What a scrape of the scheduler
costs"). Units: compute in milli-cards (1000 = one card, the project's unit), memory in bytes,
CPU in cores, time in seconds.
Each server gets its own registry, so several can run in one process (tests, benchmarks).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Card
from elastic_gpu.runtime.metrics import GaugeText, PageText, label_text, written_page

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MIB = 1 << 20
PREFIX = "elasticgpu_scheduler_"
#: The labels of a per-card series.
CARD_LABELS = ["node", "device_index", "device_uuid", "model"]
#: The labels of a per-container share of a card.
CONTAINER_LABELS = ["namespace", "pod", "container", "node", "device_index", "device_uuid",
                    "model"]

#: node -> [(card index, milli-cards allocated, MiB allocated)] (the state's is a
#: `core.placement.cardtable.CardTable`: each node's list made as the page reaches it)
Usage = Mapping[str, Sequence[tuple[int, int, int]]]
#: node -> (CPU milli, memory MiB) that its bound pods ask for
HostUsage = dict[str, tuple[int, int]]
#: (pods waiting for GPU capacity, counters by name: rounds, woken, sent, failed, turned_away)
WakeupStats = tuple[int, dict[str, int]]
#: (namespace, pod, the cards it holds)
PodShares = Iterable[tuple[str, str, Assignment]]
#: The page's writer pauses after this many nodes' cards (eight times as many pods or nodes of
#: the one-series-a-node families): `_StateText`.
PAUSE_EVERY = 16


class _StateCollector(Collector):
    """The few gauges read from the scheduler's state at scrape time: workload, wake-ups,
    ElasticGPUs per node, distrusted assignments (the many per card: `_StateText`)."""

    def __init__(self, workload: Callable[[], tuple[int, int]] | None,
                 wakeups: Callable[[], WakeupStats] | None,
                 egpus: Callable[[], Mapping[str, Assignment]] | None,
                 distrusted: Callable[[], Mapping[str, str]] | None) -> None:
        self._distrusted = distrusted
        self._egpus = egpus
        self._workload = workload
        self._wakeups = wakeups

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self._workload is not None:
            live, typical = self._workload()
            yield GaugeMetricFamily(PREFIX + "workload_live_pods",
                                    "Live pods counted for the observed target workload "
                                    "(0 with targetWorkload: builtin)", value=live)
            yield GaugeMetricFamily(PREFIX + "workload_typical_shapes",
                                    "Task shapes in the target workload FGD scores against",
                                    value=typical)
        if self._wakeups is not None:
            yield from wakeup_families(self._wakeups())
        if self._egpus is not None:
            yield from elasticgpu_families(self._egpus())
        if self._distrusted is not None:
            yield GaugeMetricFamily(PREFIX + "distrusted_assignments",
                                    "Live pods whose elasticgpu.io/assignment the extender "
                                    "does not count: not written by its Binding (the pod is "
                                    "not bound, or bound elsewhere than the annotation names)",
                                    value=len(self._distrusted()))


class _StateText:
    """The families with a series per card, per share and per node, read from the state at
    scrape time and written as text (`runtime.metrics.GaugeText`: prometheus_client's
    objects cost ~8 us a series, a page of 1,000 nodes ~0.45 s of the event loop), in pieces
    (`runtime.metrics.PageText`): an empty piece every `PAUSE_EVERY` nodes (16 nodes of 8
    cards: ~0.5 ms of writing) lets the event loop answer verbs in between."""

    def __init__(self, usage: Callable[[], Usage], host: Callable[[], HostUsage] | None,
                 cards: Callable[[], Mapping[str, tuple[Card, ...]]] | None,
                 pods: Callable[[], PodShares] | None) -> None:
        self._usage = usage
        self._host = host
        self._cards = cards
        self._pods = pods

    def __call__(self) -> Iterator[bytes]:
        inventory = self._cards() if self._cards is not None else {}
        yield from card_text(self._usage(), inventory)
        if self._pods is not None:
            yield from container_text(self._pods(), inventory)
        if self._host is not None:
            yield from host_text(self._host())


def host_text(host: HostUsage) -> Iterator[bytes]:
    """What FGD's fit test sees of a node's CPU and memory (kube-scheduler owns both; a
    difference from its own accounting shows here)."""
    cpu = GaugeText(PREFIX + "node_requested_cpu_cores",
                    "CPU that the pods bound to a node ask for, as the extender last saw them, "
                    "cores")
    memory = GaugeText(PREFIX + "node_requested_memory_bytes",
                       "Memory that the pods bound to a node ask for, as the extender last saw "
                       "them, bytes")
    for count, (node, (cpu_milli, memory_mib)) in enumerate(host.items(), 1):
        labels = label_text((("node", node),))
        cpu.add(labels, cpu_milli / 1000)
        memory.add(labels, memory_mib * MIB)
        if count % (8 * PAUSE_EVERY) == 0:
            yield b""
    yield from cpu.chunks()
    yield from memory.chunks()


def card_text(usage: Usage, inventory: Mapping[str, tuple[Card, ...]]) -> Iterator[bytes]:
    """Allocation per card (always), capacity and health per card (where the inventory is
    known: the labels uuid and model come from it)."""
    allocated = GaugeText(PREFIX + "card_compute_allocated_millicards",
                          "Compute allocated on a card in the extender's ledger, milli-cards "
                          "(1000 = the whole card)")
    memory = GaugeText(PREFIX + "card_memory_allocated_bytes",
                       "Card memory allocated in the extender's ledger, bytes")
    capacity = GaugeText(PREFIX + "card_compute_capacity_millicards",
                         "Compute of a card, milli-cards (1000 = one card)")
    memory_capacity = GaugeText(PREFIX + "card_memory_capacity_bytes", "Memory of a card, bytes")
    healthy = GaugeText(PREFIX + "card_healthy",
                        "1 if the card is healthy (the scheduler places on it), 0 if not")
    for count, (node, rows) in enumerate(usage.items(), 1):
        if count % PAUSE_EVERY == 0:
            yield b""
        by_index = {card.index: card for card in inventory.get(node, ())}
        for index, used_milli, used_mib in rows:
            card = by_index.get(index)
            labels = label_text(zip(CARD_LABELS, (node, str(index), card.uuid if card else "",
                                                  card.model if card else ""), strict=True))
            allocated.add(labels, used_milli)
            memory.add(labels, used_mib * MIB)
            if card is not None:
                capacity.add(labels, card.compute_milli)
                memory_capacity.add(labels, card.memory_mib * MIB)
                healthy.add(labels, 1 if card.healthy else 0)
    for family in (allocated, memory, capacity, memory_capacity, healthy):
        yield from family.chunks()


def container_text(shares: Iterable[tuple[str, str, Assignment]],
                   inventory: Mapping[str, tuple[Card, ...]]) -> Iterator[bytes]:
    """What each container holds of each card (a pod's assignment, as the ledger has it)."""
    milli = GaugeText(PREFIX + "container_compute_allocated_millicards",
                      "Compute a container holds on a card, milli-cards")
    memory = GaugeText(PREFIX + "container_memory_allocated_bytes",
                       "Card memory a container holds, bytes")
    models: dict[str, dict[int, str]] = {}  # of the nodes shares are on, as met
    for count, (namespace, pod, assignment) in enumerate(shares, 1):
        if count % (8 * PAUSE_EVERY) == 0:
            yield b""
        node = assignment.node
        model = models.get(node)
        if model is None:
            model = models[node] = {card.index: card.model for card in inventory.get(node, ())}
        for container, cards in sorted(assignment.containers.items()):
            for share in cards:
                labels = label_text(zip(CONTAINER_LABELS, (
                    namespace, pod, container, node, str(share.index), share.uuid,
                    model.get(share.index, "")), strict=True))
                milli.add(labels, share.milli)
                memory.add(labels, share.memory_mib * MIB)
    yield from milli.chunks()
    yield from memory.chunks()


def elasticgpu_families(holds: Mapping[str, Assignment]) -> Iterator[GaugeMetricFamily]:
    """The ElasticGPUs whose cards the ledger holds, per node, and what they hold."""
    count = GaugeMetricFamily(PREFIX + "elasticgpus_held",
                              "ElasticGPUs holding cards in the extender's ledger, per node",
                              labels=["node"])
    milli = GaugeMetricFamily(PREFIX + "elasticgpu_compute_held_millicards",
                              "Compute that ElasticGPUs hold on a node, milli-cards",
                              labels=["node"])
    per_node: dict[str, tuple[int, int]] = {}
    for assignment in holds.values():
        held, total = per_node.get(assignment.node, (0, 0))
        per_node[assignment.node] = (held + 1, total + sum(s.milli for s in assignment.shares()))
    for node, (held, total) in sorted(per_node.items()):
        count.add_metric([node], held)
        milli.add_metric([node], total)
    yield count
    yield milli


def wakeup_families(stats: WakeupStats) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    waiting, counts = stats
    yield GaugeMetricFamily(PREFIX + "waiting_pods",
                            "Pending pods the filter turned away for GPU reasons, waiting for "
                            "GPU capacity to free", value=waiting)
    wakeups = CounterMetricFamily(PREFIX + "wakeups",
                                  "Pending pods woken because GPU capacity they fit freed, by "
                                  "the outcome of the wake-up write (sent, failed)",
                                  labels=["result"])
    for result in ("sent", "failed"):
        wakeups.add_metric([result], counts.get(result, 0))
    yield wakeups
    yield CounterMetricFamily(PREFIX + "wakeup_rounds",
                              "Rounds that looked for pending pods to wake after GPU capacity "
                              "freed", value=counts.get("rounds", 0))
    yield CounterMetricFamily(PREFIX + "turned_away",
                              "Filter calls that found no node with GPU room for a pod (it "
                              "then waits for capacity)", value=counts.get("turned_away", 0))


def main_reason(categories: Iterable[str] | Mapping[str, int]) -> str:
    """The category most nodes failed on (ties: the alphabetically first), `none` if no node
    was asked about: the `reason` of `elasticgpu_scheduler_unschedulable_total`. `categories`:
    one per node, or how many nodes failed on each (`fit.category_counts`)."""
    tally = Tally(categories)
    if not tally:
        return "none"
    return min(tally.items(), key=lambda item: (-item[1], item[0]))[0]


class Metrics:
    def __init__(self, usage: Callable[[], Usage],
                 host: Callable[[], HostUsage] | None = None,
                 workload: Callable[[], tuple[int, int]] | None = None,
                 wakeups: Callable[[], WakeupStats] | None = None,
                 egpus: Callable[[], Mapping[str, Assignment]] | None = None,
                 cards: Callable[[], Mapping[str, tuple[Card, ...]]] | None = None,
                 pods: Callable[[], PodShares] | None = None,
                 distrusted: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(PREFIX + "request_duration_seconds",
                                 "Extender request latency by verb", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter(PREFIX + "requests",
                                "Extender requests answered, by verb and outcome (filter: "
                                "feasible, unschedulable, error; bind: bound, failed; "
                                "provision: ok, error; others: ok, error; any verb: "
                                "bad_request, busy, not_ready, standby, internal_error)",
                                ["verb", "outcome"], registry=self.registry)
        self.bind_failures = Counter(PREFIX + "bind_failures",
                                     "Binds that failed, by stage", ["stage"],
                                     registry=self.registry)
        self.bind_conflicts = Counter(PREFIX + "bind_conflicts",
                                      "Binds that met a conflict: reserve (the cards were taken "
                                      "since the filter) or binding (the apiserver's 409 on the "
                                      "pod's uid/resourceVersion preconditions)", ["stage"],
                                      registry=self.registry)
        self.unschedulable = Counter(PREFIX + "unschedulable",
                                     "Filter calls for a GPU pod that no node passed, by the "
                                     "reason most nodes failed on (gpu, model, resource, mig, "
                                     "cpu, memory, node; claim, dra: refused by the pod's "
                                     "claims or a DRA-mode node)", ["reason"],
                                     registry=self.registry)
        self.filter_answers = Counter(PREFIX + "filter_answers",
                                      "Filter calls for a GPU pod by what they were to answer: "
                                      "the engine's one node (one) or every node that fits "
                                      "(every), and why (filterResult: auto decides per pod: "
                                      "none, soft_preference, prefer_no_schedule_taint; "
                                      "configured: filterResult best or all)",
                                      ["answer", "because"], registry=self.registry)
        self.bad_requests = Counter(PREFIX + "bad_requests",
                                    "Requests rejected as malformed, by verb", ["verb"],
                                    registry=self.registry)
        self.provisioned = Counter(PREFIX + "elasticgpus_provisioned",
                                   "ElasticGPUs created by /provision", registry=self.registry)
        self.registry.register(_StateCollector(workload, wakeups, egpus, distrusted))
        #: the per-card, per-share and per-node families, written after the registry's
        self.state_text: PageText = _StateText(usage, host, cards, pods)

    async def pieces(self, accept: str = "") -> tuple[list[bytes], str]:
        """The whole `/metrics` page (in pieces, content type) for a scraper's `Accept`,
        written between other work on the event loop (`runtime.metrics.written_page`)."""
        return await written_page(self.registry, accept, self.state_text)

    async def page(self, accept: str = "") -> tuple[bytes, str]:
        """`pieces` joined (for readers in process; the HTTP routes send the pieces)."""
        pieces, content_type = await self.pieces(accept)
        return b"".join(pieces), content_type
