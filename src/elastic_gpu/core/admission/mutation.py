"""The one interface of every mutator: a function of `MutationInput` to JSON Patch operations.

Each feature owns its mutator (`mutators.claims`, `mutators.resources`, `mutators.mig`,
`mutators.budget`, `core.quota.quota_resources`); `chain` puts them in order. A mutator gets
the pod as the earlier mutators left it and returns nothing for a pod it already mutated, so
the patch is empty under reinvocation (`reinvocationPolicy: IfNeeded`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core.admission.claim_plan import PodClaims
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import PatchOp
from elastic_gpu.core.budget.priority import PriorityDowngrade
from elastic_gpu.core.dra.podclaims import PodDraClaims
from elastic_gpu.core.request import PodRequest


@dataclass(frozen=True)
class MutationInput:
    """What a mutator reads: the pod as the mutators before it left it, its parsed request
    (of the pod as admitted, with the resources of the claims it names), the cluster facts
    and the claims the pod names."""

    pod: Mapping[str, Any]
    request: PodRequest
    facts: ClusterFacts
    claims: PodClaims = field(default_factory=PodClaims)
    #: the lower PriorityClass while the pod's namespace is over its GPU budget (issue #17)
    budget: PriorityDowngrade | None = None
    #: the pod's namespace has a GPU budget (`core.budget.priority.NamespaceBudget.budgeted`)
    budgeted: bool = False
    #: the ResourceClaims and templates the pod names, as the webhook found them (the DRA
    #: rules, quota and budget, `mutators.dra`, and the placement gate, `mutators.dra_gate`)
    dra: PodDraClaims = field(default_factory=PodDraClaims)

    @property
    def gpu_pod(self) -> bool:
        """The pod asks a GPU: by device-plugin names or through claims of our classes."""
        return self.request.wants_gpu or bool(self.dra.ours())


Mutator = Callable[[MutationInput], list[PatchOp]]
