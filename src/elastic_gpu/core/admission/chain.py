"""The order of the mutators, in one place, and the webhook's choice of them.

`MUTATORS` is the default chain; the quota's accounting resources (`--quota-resources`) and the
budget keeper's finalizer (`--budget-finalizer`) are opt-in links, added by `mutator_chain`.
"""

from __future__ import annotations

from elastic_gpu.core.admission.mutation import Mutator
from elastic_gpu.core.admission.mutators.budget import budget_finalizer, budget_priority
from elastic_gpu.core.admission.mutators.claims import claim_resources
from elastic_gpu.core.admission.mutators.dra import dra_billing
from elastic_gpu.core.admission.mutators.dra_gate import dra_gate
from elastic_gpu.core.admission.mutators.mig import mig_substitution
from elastic_gpu.core.admission.mutators.resources import (
    memory_only_compute,
    node_resources,
    vcuda_core_limit,
    whole_cards_as_shares,
)
from elastic_gpu.core.quota import quota_resources

#: as the claims complete them (a claim of memory only gets its compute device, like a pod
#: asking memory only); then `elasticgpu.io/gpu` is written as the shares it stands for. The
#: MIG adapter's rewrite comes after the claims (a claim's MIG request is rewritten like a
#: container's own); the node-level GPU count reads the containers as all
#: of those left them; the ResourceClaims the pod bills are written down (`dra_billing`), then
#: the DRA placement gate (both read only the pod's claims); the budget's priority comes last.
MUTATORS: tuple[Mutator, ...] = (claim_resources, whole_cards_as_shares, memory_only_compute,
                                 vcuda_core_limit, mig_substitution, node_resources,
                                 dra_billing, dra_gate, budget_priority)

#: The mutators with the quota's accounting resources added (last: they read the containers
#: as the claims and the MIG substitution left them).
QUOTA_MUTATORS: tuple[Mutator, ...] = (*MUTATORS, quota_resources)


def mutator_chain(*, quota: bool = False, finalizer: bool = False) -> tuple[Mutator, ...]:
    """The chain the webhook runs: `MUTATORS`, with the quota's resources when `quota`, and the
    budget keeper's finalizer last when `finalizer`."""
    base = QUOTA_MUTATORS if quota else MUTATORS
    return (*base, budget_finalizer) if finalizer else tuple(base)
