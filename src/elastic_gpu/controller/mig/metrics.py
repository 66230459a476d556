"""The MIG adapter's metrics: moves, unmovable pods, re-created bare pods, rules, pending pods."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from elastic_gpu.controller.manager import Context


class MigMetrics:
    def __init__(self, ctx: Context) -> None:
        registry = ctx.metrics.registry
        self.moves = Counter(
            "elasticgpu_mig_moves", "Pods moved by the MIG adapter, by direction (substitute: "
            "to a compatible profile; back: to their original), profiles and namespace",
            ["direction", "from_profile", "to_profile", "namespace"], registry=registry)
        self.unmovable = Counter(
            "elasticgpu_mig_unmovable", "Pending MIG pods found unmovable (counted once per pod "
            "and reason, when its Event is written), by reason (NoCompatibleProfileFree)",
            ["reason", "namespace"], registry=registry)
        self.recreated = Counter(
            "elasticgpu_mig_bare_pods_recreated", "Bare pods created again from their rule's "
            "saved manifest, by step (move, back, recovered: after a controller stopped "
            "between the delete and the create)", ["step"], registry=registry)
        self.rules = Gauge("elasticgpu_mig_rules", "MIGSubstitutions in the cache",
                           registry=registry)
        self.pending = Gauge("elasticgpu_mig_pending_pods",
                             "Pods pending for a MIG profile the adapter governs (last round)",
                             registry=registry)
