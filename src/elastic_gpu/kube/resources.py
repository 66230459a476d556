"""The API resources the project reads and writes, in one table: our kinds and the core ones.

A `Resource` is the path builder's input (`kube.paths`): the group's prefix, the plural and
whether the kind is namespaced. Every kind of the Elastic GPU API is named here once, from the
wire contracts in `api/` (group, version, plural), so no component spells a path of its own
and none borrows another's constant. `tests/unit/kube/test_kube_resources.py` checks the table
against the CRDs the project installs.
"""

from __future__ import annotations

from elastic_gpu.api import budget, elasticgpu, gpudevice, miglayout, migsubstitution
from elastic_gpu.api.group import ELASTICGPU_VERSION, GROUP, INVENTORY_VERSION
from elastic_gpu.kube.paths import CORE, Resource, group_prefix

__all__ = ["BUDGETS", "CLAIMS", "CLASSES", "CRDS", "DEVICE_CLASSES", "ELASTICGPUS", "EVENTS",
           "GPUDEVICES", "LEASES", "MIG_LAYOUTS", "MIG_SUBSTITUTIONS", "MUTATING_WEBHOOKS", "NAMESPACES",
           "NODES", "PODS", "PRIORITY_CLASSES", "RESOURCES", "RESOURCE_CLAIMS",
           "RESOURCE_CLAIM_TEMPLATES", "RESOURCE_SLICES", "SECRETS", "VALIDATING_WEBHOOKS"]

#: `/apis/elasticgpu.io/v1alpha`: the Elastic GPU API's kinds, GPUBudget, MIGSubstitution and
#: MigLayout
_EGPU_API = group_prefix(GROUP, ELASTICGPU_VERSION)

CLASSES = Resource(_EGPU_API, elasticgpu.CLASS_PLURAL, False)
CLAIMS = Resource(_EGPU_API, elasticgpu.CLAIM_PLURAL, True)
ELASTICGPUS = Resource(_EGPU_API, elasticgpu.EGPU_PLURAL, False)
BUDGETS = Resource(_EGPU_API, budget.PLURAL, True)
MIG_SUBSTITUTIONS = Resource(_EGPU_API, migsubstitution.PLURAL, True)
MIG_LAYOUTS = Resource(_EGPU_API, miglayout.PLURAL, False)
#: the card inventory the agents publish (`/apis/elasticgpu.io/v1alpha1`)
GPUDEVICES = Resource(group_prefix(GROUP, INVENTORY_VERSION), gpudevice.PLURAL, False)

PODS = Resource(CORE, "pods", True)
NODES = Resource(CORE, "nodes", False)
EVENTS = Resource(CORE, "events", True)
SECRETS = Resource(CORE, "secrets", True)
NAMESPACES = Resource(CORE, "namespaces", False)
LEASES = Resource(group_prefix("coordination.k8s.io", "v1"), "leases", True)
CRDS = Resource(group_prefix("apiextensions.k8s.io", "v1"), "customresourcedefinitions", False)
PRIORITY_CLASSES = Resource(group_prefix("scheduling.k8s.io", "v1"), "priorityclasses", False)
_ADMISSION_API = group_prefix("admissionregistration.k8s.io", "v1")
_RESOURCE_API = group_prefix("resource.k8s.io", "v1")
RESOURCE_SLICES = Resource(_RESOURCE_API, "resourceslices", False)
RESOURCE_CLAIMS = Resource(_RESOURCE_API, "resourceclaims", True)
RESOURCE_CLAIM_TEMPLATES = Resource(_RESOURCE_API, "resourceclaimtemplates", True)
DEVICE_CLASSES = Resource(_RESOURCE_API, "deviceclasses", False)
MUTATING_WEBHOOKS = Resource(_ADMISSION_API, "mutatingwebhookconfigurations", False)
VALIDATING_WEBHOOKS = Resource(_ADMISSION_API, "validatingwebhookconfigurations", False)

#: our kinds by name (the CRDs' `spec.names.kind`)
RESOURCES: dict[str, Resource] = {
    elasticgpu.CLASS_KIND: CLASSES,
    elasticgpu.CLAIM_KIND: CLAIMS,
    elasticgpu.EGPU_KIND: ELASTICGPUS,
    budget.KIND: BUDGETS,
    migsubstitution.KIND: MIG_SUBSTITUTIONS,
    miglayout.KIND: MIG_LAYOUTS,
    gpudevice.KIND: GPUDEVICES,
}
