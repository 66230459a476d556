"""The DRA placement gate: a pod whose ResourceClaims are of our card class or our MIG class
waits for our allocator (docs/dra.md, "Claims placed by our engine").

The pod gets the scheduling gate `elasticgpu.io/dra-placement` at CREATE (a gate can only be
added then); kube-scheduler leaves a gated pod alone, the extender's DRA allocator
(`scheduler.dra_allocator`) places its claims with our engine, writes their allocations and
lifts the gate. The adapter says which DeviceClasses the pod's claims and claim templates
name (`PodDraClaims.classes`, from the one live read of them, `webhook.draclaims`) and which
of ours an operator left to kube-scheduler (the class annotation
`elasticgpu.io/dra-placement: kube-scheduler`, `PodDraClaims.opted_out`).
"""

from __future__ import annotations

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.jsonpatch import PatchOp
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.podclaims import PodDraClaims

#: The classes whose claims our allocator places: shares and whole cards, and MIG instances
#: (requests the one MIG reader cannot read are handed to kube-scheduler by the allocator).
PLACED_CLASSES = frozenset({CARD_CLASS, MIG_CLASS})


def wants_gate(claims: PodDraClaims) -> bool:
    """Whether our allocator places the pod's claims: one of them is of a class it places
    that the operator did not leave to kube-scheduler."""
    return bool(claims.classes() & (PLACED_CLASSES - claims.opted_out))


def dra_gate(data: MutationInput) -> list[PatchOp]:
    """The gate on a pod with claims of our card or MIG class (none already: idempotent; a pod bound
    at creation cannot be gated, and the webhook refuses GPU pods with a node name anyway)."""
    if not wants_gate(data.dra):
        return []
    spec = data.pod.get("spec") or {}
    if spec.get("nodeName"):
        return []
    gates = spec.get("schedulingGates")
    gate = {"name": ann.DRA_PLACEMENT_GATE}
    if not isinstance(gates, list):
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    if any(isinstance(g, dict) and g.get("name") == ann.DRA_PLACEMENT_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]
