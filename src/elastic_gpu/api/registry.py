"""Every CustomResourceDefinition of the project, in one list: the chart, the sandbox and the
tests install from here, so a new kind is added in one place (docs/architecture.md, "Where does
my change go")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_gpu.api import budget, elasticgpu, gpudevice, miglayout, migsubstitution


@dataclass(frozen=True)
class CrdEntry:
    kind: str
    manifest: Callable[[], dict[str, Any]]
    #: Who installs it in the sandbox: "installer" (the Elastic GPU API, with an admin's
    #: credentials, like `kubectl apply -f deploy/crds/`) or "agent" (GPUDevice, which the
    #: agent ensures itself where it may).
    installed_by: str


def _elasticgpu(plural: str) -> Callable[[], dict[str, Any]]:
    return lambda: elasticgpu.crd_manifests()[plural]


CRDS: tuple[CrdEntry, ...] = (
    CrdEntry(elasticgpu.CLASS_KIND, _elasticgpu(elasticgpu.CLASS_PLURAL), "installer"),
    CrdEntry(elasticgpu.CLAIM_KIND, _elasticgpu(elasticgpu.CLAIM_PLURAL), "installer"),
    CrdEntry(elasticgpu.EGPU_KIND, _elasticgpu(elasticgpu.EGPU_PLURAL), "installer"),
    CrdEntry(migsubstitution.KIND, migsubstitution.crd_manifest, "installer"),
    CrdEntry(budget.KIND, budget.crd_manifest, "installer"),
    CrdEntry(miglayout.KIND, miglayout.crd_manifest, "installer"),
    CrdEntry(gpudevice.KIND, gpudevice.crd_manifest, "agent"),
)


def manifests(installed_by: str | None = None) -> list[dict[str, Any]]:
    """The CRDs (all, or those one party installs), in the order above."""
    return [entry.manifest() for entry in CRDS
            if installed_by is None or entry.installed_by == installed_by]
