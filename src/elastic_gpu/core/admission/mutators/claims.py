"""The claims' mutator: a container naming an ElasticGPUClaim gets the claim's resources."""

from __future__ import annotations

from elastic_gpu.core.admission.claim_plan import claim_ops, claim_plan
from elastic_gpu.core.admission.jsonpatch import PatchOp
from elastic_gpu.core.admission.mutation import MutationInput


def claim_resources(data: MutationInput) -> list[PatchOp]:
    """Each container that names an ElasticGPUClaim gets the claim's requests in its limits
    and requests, under the names the agent advertises (`claim_container_resources`): the
    extender then places the pod (its managed resources) and kubelet calls the agent's
    Allocate for them. Idempotent: a container carrying them already gets nothing."""
    plan = claim_plan(data.pod, data.claims)
    if plan.refusals:  # validation refused these already
        return []
    return claim_ops(data.pod, plan)
