"""What the claim decisions return: in sync, bind, provision, pending (why), lost; and the
claim's phase and Bound condition once one is carried out (`claim_outcome`).
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_gpu.core.claims.model import BOUND_CONDITION, ClaimPhase, Condition, LostReason, PendingReason
from elastic_gpu.core.request import (
    PodRequest,
)

# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class InSync:
    """Claim and ElasticGPU already point at each other and both say Bound."""

    elastic_gpu: str


@dataclass(frozen=True)
class Bind:
    """Write ElasticGPU.spec.claimRef = the claim (phase Bound), then the claim's
    spec.elasticGPUName = the ElasticGPU (phase Bound), in that order (like the PV binder):
    a controller killed between the two finds the ElasticGPU claimed and finishes the claim."""

    elastic_gpu: str


@dataclass(frozen=True)
class Provision:
    provisioner: str
    request: PodRequest
    #: WaitForFirstConsumer: the node the first consumer was placed on; None: any node
    node: str | None = None


@dataclass(frozen=True)
class Pending:
    reason: PendingReason
    message: str


@dataclass(frozen=True)
class Lost:
    reason: LostReason
    message: str


Decision = InSync | Bind | Provision | Pending | Lost


def claim_outcome(decision: Decision, current: ClaimPhase) -> tuple[ClaimPhase, Condition]:
    """The claim's phase and Bound condition once `decision` is carried out. A Provision in
    flight keeps the phase it has (Pending)."""
    if isinstance(decision, InSync | Bind):
        return ClaimPhase.BOUND, Condition(BOUND_CONDITION, "True", "Bound",
                                           f"bound to ElasticGPU {decision.elastic_gpu}")
    if isinstance(decision, Provision):
        where = f" on node {decision.node}" if decision.node else ""
        return current, Condition(BOUND_CONDITION, "False", "Provisioning",
                                  f"provisioning by {decision.provisioner}{where}")
    if isinstance(decision, Lost):
        return ClaimPhase.LOST, Condition(BOUND_CONDITION, "False", decision.reason.value,
                                          decision.message)
    return ClaimPhase.PENDING, Condition(BOUND_CONDITION, "False", decision.reason.value,
                                         decision.message)
