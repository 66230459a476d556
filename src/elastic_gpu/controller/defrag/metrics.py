"""The defragmentation controller's metrics: evictions by result, plans by outcome, pods
waiting for capacity (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from elastic_gpu.controller.manager import Context


class DefragMetrics:
    def __init__(self, ctx: Context) -> None:
        registry = ctx.metrics.registry
        self.evictions = Counter(
            "elasticgpu_defrag_evictions", "Evictions asked by the defragmentation controller, "
            "by result (moved; refused: a PodDisruptionBudget said no; failed)", ["result"],
            registry=registry)
        self.plans = Counter(
            "elasticgpu_defrag_plans", "Plans made by the defragmentation controller, by "
            "outcome (reported: report mode; carried_out; rate_limited)", ["outcome"],
            registry=registry)
        self.pending = Gauge(
            "elasticgpu_defrag_pending_pods", "Pods waiting for GPU capacity in namespaces the "
            "defragmentation controller governs (last round)", registry=registry)
