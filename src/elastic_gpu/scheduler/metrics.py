"""Prometheus metrics of the extender: latency per verb, allocation per card, bind failures,
the CPU and memory the extender believes bound pods ask of each node, and the wake-up of pending
pods (how many wait for GPU capacity, how many were woken).

Per-card allocation and per-node requests are collected at scrape time from the engine (no cost
on the hot path).
Each server gets its own registry, so several can run in one process (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from elastic_gpu.core.assignment import Assignment

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

Usage = dict[str, list[tuple[int, int, int]]]
#: node -> (CPU milli, memory MiB) that its bound pods ask for
HostUsage = dict[str, tuple[int, int]]
#: (pods waiting for GPU capacity, counters by name: rounds, woken, sent, failed, turned_away)
WakeupStats = tuple[int, dict[str, int]]


class _StateCollector(Collector):
    """Gauges read from the scheduler's state at scrape time: per card, per node, workload."""

    def __init__(self, usage: Callable[[], Usage], host: Callable[[], HostUsage] | None,
                 workload: Callable[[], tuple[int, int]] | None,
                 wakeups: Callable[[], WakeupStats] | None = None,
                 egpus: Callable[[], Mapping[str, Assignment]] | None = None) -> None:
        self._egpus = egpus
        self._usage = usage
        self._host = host
        self._workload = workload
        self._wakeups = wakeups

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        milli = GaugeMetricFamily("egpu_scheduler_card_allocated_milli",
                                  "Compute allocated on a card, in milli-cards (1000 = whole)",
                                  labels=["node", "card"])
        memory = GaugeMetricFamily("egpu_scheduler_card_allocated_memory_mib",
                                   "Card memory allocated, MiB", labels=["node", "card"])
        for node, cards in self._usage().items():
            for index, used_milli, used_mib in cards:
                milli.add_metric([node, str(index)], used_milli)
                memory.add_metric([node, str(index)], used_mib)
        yield milli
        yield memory
        if self._workload is not None:
            live, typical = self._workload()
            yield GaugeMetricFamily("egpu_scheduler_workload_live_pods",
                                    "Live pods counted for the observed target workload "
                                    "(0 with targetWorkload: builtin)", value=live)
            yield GaugeMetricFamily("egpu_scheduler_workload_typical_shapes",
                                    "Task shapes in the target workload FGD scores against",
                                    value=typical)
        if self._wakeups is not None:
            yield from wakeup_families(self._wakeups())
        if self._egpus is not None:
            yield from elasticgpu_families(self._egpus())
        if self._host is None:
            return
        # What FGD's fit test sees of a node's CPU and memory (kube-scheduler owns both; a
        # difference from its own accounting shows here)
        cpu = GaugeMetricFamily("egpu_scheduler_node_requested_cpu_milli",
                                "CPU that the pods bound to a node ask for, as the extender "
                                "last saw them, milli-CPU", labels=["node"])
        host_memory = GaugeMetricFamily("egpu_scheduler_node_requested_memory_mib",
                                        "Memory that the pods bound to a node ask for, as the "
                                        "extender last saw them, MiB", labels=["node"])
        for node, (cpu_milli, memory_mib) in self._host().items():
            cpu.add_metric([node], cpu_milli)
            host_memory.add_metric([node], memory_mib)
        yield cpu
        yield host_memory


def elasticgpu_families(holds: Mapping[str, Assignment]) -> Iterator[GaugeMetricFamily]:
    """The ElasticGPUs whose cards the ledger holds, per node, and what they hold."""
    count = GaugeMetricFamily("egpu_scheduler_elasticgpus_held",
                              "ElasticGPUs holding cards in the extender's ledger, per node",
                              labels=["node"])
    milli = GaugeMetricFamily("egpu_scheduler_elasticgpu_held_milli",
                              "Compute that ElasticGPUs hold on a node, in milli-cards",
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
    yield GaugeMetricFamily("egpu_scheduler_waiting_pods",
                            "Pending pods the filter turned away for GPU reasons, waiting for "
                            "GPU capacity to free", value=waiting)
    wakeups = CounterMetricFamily("egpu_scheduler_wakeups",
                                  "Pending pods woken because GPU capacity they fit freed, by "
                                  "the outcome of the wake-up write (sent, failed)",
                                  labels=["result"])
    for result in ("sent", "failed"):
        wakeups.add_metric([result], counts.get(result, 0))
    yield wakeups
    yield CounterMetricFamily("egpu_scheduler_wakeup_rounds",
                              "Rounds that looked for pending pods to wake after GPU capacity "
                              "freed", value=counts.get("rounds", 0))
    yield CounterMetricFamily("egpu_scheduler_turned_away",
                              "Filter calls that found no node with GPU room for a pod (it "
                              "then waits for capacity)", value=counts.get("turned_away", 0))


class Metrics:
    def __init__(self, usage: Callable[[], Usage],
                 host: Callable[[], HostUsage] | None = None,
                 workload: Callable[[], tuple[int, int]] | None = None,
                 wakeups: Callable[[], WakeupStats] | None = None,
                 egpus: Callable[[], Mapping[str, Assignment]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("egpu_scheduler_request_seconds",
                                 "Extender request latency by verb", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bind_failures = Counter("egpu_scheduler_bind_failures_total",
                                     "Binds that failed, by stage", ["stage"],
                                     registry=self.registry)
        self.bad_requests = Counter("egpu_scheduler_bad_requests_total",
                                    "Requests rejected as malformed, by verb", ["verb"],
                                    registry=self.registry)
        self.provisioned = Counter("egpu_scheduler_elasticgpus_provisioned_total",
                                   "ElasticGPUs created by /provision", registry=self.registry)
        self.registry.register(_StateCollector(usage, host, workload, wakeups, egpus))
