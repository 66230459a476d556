"""The claims controller's gauges: claims and ElasticGPUs by phase, computed from the caches
at scrape time (nothing to keep up to date between scrapes)."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from elastic_gpu.controller.claims.caches import ClaimCaches
from elastic_gpu.core.claims.model import ClaimPhase, ElasticGPUPhase
from elastic_gpu.kube.informer import Obj


class PhaseCollector(Collector):
    def __init__(self, caches: ClaimCaches) -> None:
        self.caches = caches

    def collect(self) -> Any:
        yield _by_phase("elasticgpu_claims", "ElasticGPUClaims by phase (cache)",
                        self.caches.claims.items(), ClaimPhase, ClaimPhase.PENDING)
        yield _by_phase("elasticgpu_elasticgpus", "ElasticGPUs by phase (cache)",
                        self.caches.egpus.items(), ElasticGPUPhase,
                        ElasticGPUPhase.PENDING)


def _by_phase(name: str, documentation: str, objects: list[Obj],
              phases: type[ClaimPhase] | type[ElasticGPUPhase],
              unset: ClaimPhase | ElasticGPUPhase) -> GaugeMetricFamily:
    """A gauge of `objects` by `status.phase` (every phase present, 0 if none; an object with
    no phase yet counts as `unset`)."""
    counts = {p.value: 0 for p in phases}
    for obj in objects:
        phase = (obj.get("status") or {}).get("phase") or unset.value
        counts[phase] = counts.get(phase, 0) + 1
    family = GaugeMetricFamily(name, documentation, labels=["phase"])
    for phase, n in sorted(counts.items()):
        family.add_metric([phase], n)
    return family

