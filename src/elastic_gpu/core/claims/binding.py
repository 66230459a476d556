"""The binding decision for one claim (`decide`): in sync, bind (static binding to a named
ElasticGPU, or finishing a provisioning interrupted between its writes), provision, pending
(with a structured reason), or lost (a bound claim whose ElasticGPU is gone or bound elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_gpu.core.claims.decisions import Bind, Decision, InSync, Lost, Pending, Provision
from elastic_gpu.core.claims.model import (
    CLAIM_CONTAINER,
    BindingMode,
    Claim,
    ClaimPhase,
    ClaimRef,
    ElasticGPU,
    ElasticGPUPhase,
    GPUClass,
    LostReason,
    PendingReason,
    provisioned_name,
)
from elastic_gpu.core.claims.provisioning import (
    PROVISIONERS,
    ClaimRequestError,
    describe_request,
    pod_request,
)
from elastic_gpu.core.request import (
    RequestKind,
    container_request,
)
from elastic_gpu.core.resources import ResourceError


def _bound_decision(claim: Claim, egpu: ElasticGPU) -> InSync | Bind:
    if claim.phase is ClaimPhase.BOUND and claim.elastic_gpu_name == egpu.name and \
            egpu.phase is ElasticGPUPhase.BOUND and egpu.claim_ref == ClaimRef.of(claim):
        return InSync(egpu.name)
    return Bind(egpu.name)


def settled(claim: Claim) -> bool:
    """Whether a claim looks done by its own object: Bound (or Lost, which is final) to an
    ElasticGPU it names, and not being deleted. A new leader's pass over every claim checks
    these behind the claims that still need work (created, pending, deleting)."""
    return claim.phase in (ClaimPhase.BOUND, ClaimPhase.LOST) and \
        claim.elastic_gpu_name is not None and not claim.deleting


def decide(claim: Claim, classes: Mapping[str, GPUClass], egpus: Mapping[str, ElasticGPU],
           consumer_node: str | None = None) -> Decision:
    """What to do for one claim. `consumer_node`: for WaitForFirstConsumer, the node its first
    consumer pod was placed on (None while no pod naming it is placed)."""
    named = claim.elastic_gpu_name
    if named is not None:
        return _decide_named(claim, named, egpus.get(named))
    provisioned = egpus.get(provisioned_name(claim))
    if provisioned is not None and provisioned.claim_ref is not None and \
            provisioned.claim_ref.matches(claim):
        return Bind(provisioned.name)  # provisioned, but the claim was not updated yet
    if claim.class_name is None:
        return Pending(PendingReason.CLASS_NOT_SET, f"claim {claim.key} names neither a class "
                       "(spec.egpuClassName) nor an ElasticGPU (spec.elasticGPUName)")
    cls = classes.get(claim.class_name)
    if cls is None:
        return Pending(PendingReason.CLASS_NOT_FOUND,
                       f"ElasticGPUClass {claim.class_name} does not exist")
    provisioner = PROVISIONERS.get(cls.provisioner)
    if provisioner is None:
        return Pending(PendingReason.PROVISIONER_UNKNOWN,
                       f"class {cls.name}: provisioner {cls.provisioner} is not a plug-in of this "
                       f"controller (known: {', '.join(sorted(PROVISIONERS))})")
    try:
        request = pod_request(claim, cls, provisioner.container(claim))
    except ClaimRequestError as err:
        return Pending(err.reason, str(err))
    if cls.binding_mode is BindingMode.WAIT_FOR_FIRST_CONSUMER and consumer_node is None:
        return Pending(PendingReason.WAIT_FOR_FIRST_CONSUMER,
                       "waiting for the first pod that names the claim to be placed")
    return Provision(provisioner.name, request, consumer_node)


def binding_to_finish(claim: Claim, egpus: Mapping[str, ElasticGPU]) -> Bind | None:
    """For a claim being deleted while pods still use it: the binding to finish, if one was
    begun before the deletion, else None.

    Begun means an ElasticGPU's claimRef already names the claim with its uid: provisioned
    for it (the extender provisions a WaitForFirstConsumer claim at its first pod's bind,
    controller up or not), or a binding interrupted after its first write. The claim is then
    finished as Bound to it, so that while it waits for its pods it says which ElasticGPU they
    hold, and it is released with that ElasticGPU when they end, as any claim deleted in use.
    Nothing is begun for a deleted claim: no provisioning, no static binding to an Available
    ElasticGPU that does not name it yet."""
    egpu = egpus.get(claim.elastic_gpu_name or provisioned_name(claim))
    ref = None if egpu is None else egpu.claim_ref
    if egpu is None or ref is None or not ref.uid or not ref.matches(claim):
        return None
    decision = _decide_named(claim, egpu.name, egpu) if claim.elastic_gpu_name else \
        Bind(egpu.name)
    return decision if isinstance(decision, Bind) else None


def _decide_named(claim: Claim, named: str, egpu: ElasticGPU | None) -> Decision:
    # Lost is final, as a PVC's: a Lost claim stays Lost rather than waiting for a new one
    bound = claim.phase in (ClaimPhase.BOUND, ClaimPhase.LOST)
    if egpu is None:
        if bound:
            return Lost(LostReason.ELASTICGPU_MISSING, f"ElasticGPU {named} of claim {claim.key} "
                        "no longer exists")
        return Pending(PendingReason.ELASTICGPU_NOT_FOUND, f"ElasticGPU {named} does not exist")
    ref = egpu.claim_ref
    if ref is not None and ref.matches(claim):
        if egpu.phase in (ElasticGPUPhase.RELEASED, ElasticGPUPhase.FAILED) and ref.uid:
            return Pending(PendingReason.ELASTICGPU_NOT_AVAILABLE,
                           f"ElasticGPU {named} is {egpu.phase.value}")
        if not ref.uid and egpu.phase in (ElasticGPUPhase.PENDING, ElasticGPUPhase.FAILED):
            # pre-bound by name, pre-created: bound only once checked against the inventory
            return Pending(PendingReason.ELASTICGPU_NOT_AVAILABLE,
                           f"ElasticGPU {named} is {egpu.phase.value}, not Available")
        return _bound_decision(claim, egpu)
    if ref is not None:
        # the claim's Events are read by its namespace's users: another namespace's claim is
        # not theirs to learn of (as the PV controller says only "bound to a different claim")
        other = f"claim {ref.name}" if ref.namespace == claim.namespace else \
            "a claim of another namespace"
        message = f"ElasticGPU {named} is bound to {other}"
        if bound:
            return Lost(LostReason.ELASTICGPU_BOUND_ELSEWHERE, message)
        return Pending(PendingReason.ELASTICGPU_BOUND_ELSEWHERE, message)
    if egpu.phase is not ElasticGPUPhase.AVAILABLE:
        return Pending(PendingReason.ELASTICGPU_NOT_AVAILABLE,
                       f"ElasticGPU {named} is {egpu.phase.value}, not Available")
    if claim.class_name is not None and egpu.class_name is not None and \
            claim.class_name != egpu.class_name:
        return Pending(PendingReason.CLASS_MISMATCH,
                       f"ElasticGPU {named} is of class {egpu.class_name}, the claim asks for "
                       f"{claim.class_name}")
    short = shortfall(claim.requests, egpu.capacity)
    if short is not None:
        return Pending(PendingReason.ELASTICGPU_TOO_SMALL, f"ElasticGPU {named}: {short}")
    return Bind(named)


def shortfall(requests: Mapping[str, int | str], capacity: Mapping[str, int | str]) -> str | None:
    """None if an ElasticGPU of `capacity` satisfies `requests` (same kind of GPU, at least as
    much of each measure), else why not."""
    try:
        want = container_request(CLAIM_CONTAINER, {"requests": dict(requests)})
        have = container_request(CLAIM_CONTAINER, {"requests": dict(capacity)})
    except (ResourceError, ValueError) as err:
        return str(err)
    if want.kind is not have.kind:
        return f"holds {describe_request(have)}, the claim asks for {describe_request(want)}"
    if want.kind is RequestKind.MIG and want.mig_profile != have.mig_profile:
        return f"holds {describe_request(have)}, the claim asks for {describe_request(want)}"
    short = [f"{what} {w} > {h}" for what, w, h in (
        ("cards", want.cards, have.cards), ("compute milli", want.compute_milli, have.compute_milli),
        ("memory MiB", want.memory_mib, have.memory_mib)) if w > h]
    if short:
        return f"too small for the claim ({', '.join(short)})"
    return None
