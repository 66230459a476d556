"""Provisioner plug-ins: a claim of a class turned into a placement request, and the
ElasticGPU that holds the placement the engine chose.

Provisioners sit behind `Provisioner` (`PROVISIONERS`, keyed by the class's `provisioner`):
the fractional share of one card the seed names (`gpushare.provisioner.elasticgpu.io`), whole
cards (`gpu.provisioner.elasticgpu.io`) and MIG instances (`mig.provisioner.elasticgpu.io`).
Each reads the claim's requests through the one resource table (`core.request.container_request`),
so a claim means what a pod's container with the same resources means. `provision` places the
claim with the same engine that places pods, so its cards are counted like a pod's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from elastic_gpu.core.claims.decisions import Pending, Provision
from elastic_gpu.core.claims.model import (
    CLAIM_CONTAINER,
    GPUSHARE,
    MIG,
    WHOLE_CARDS,
    Claim,
    ClaimRef,
    ElasticGPU,
    ElasticGPUPhase,
    GPUClass,
    PendingReason,
    provisioned_name,
)
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.policies import card_policy as make_card_policy
from elastic_gpu.core.policies import node_policy as make_node_policy
from elastic_gpu.core.request import (
    ContainerRequest,
    PodRequest,
    RequestKind,
    container_request,
    parse_model_list,
)
from elastic_gpu.core.resources import ResourceError


class ClaimRequestError(ValueError):
    """A claim (or its class's parameters) a provisioner cannot turn into a request."""

    def __init__(self, reason: PendingReason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


# --------------------------------------------------------------------------- provisioners


class Provisioner(Protocol):
    """A provisioner plug-in: claim -> placement request, placement -> ElasticGPU."""

    @property
    def name(self) -> str:
        """The class's `provisioner` it serves."""

    @property
    def provides(self) -> str:
        """What it provisions, for messages ("whole cards")."""

    @property
    def kinds(self) -> frozenset[RequestKind]:
        """The request kinds it accepts."""

    def container(self, claim: Claim) -> ContainerRequest:
        """The claim's requests as one container's, or ClaimRequestError."""


@dataclass(frozen=True)
class TableProvisioner:
    """A provisioner for the requests of some kinds of the resource table."""

    name: str
    provides: str
    kinds: frozenset[RequestKind]

    def container(self, claim: Claim) -> ContainerRequest:
        """The claim's requests read like one container's (`container_request`), refused
        unless of a kind this provisioner makes."""
        try:
            request = container_request(CLAIM_CONTAINER, {"requests": dict(claim.requests)})
        except (ResourceError, ValueError) as err:
            raise ClaimRequestError(PendingReason.INVALID_REQUEST,
                                    f"claim {claim.key}: spec.resources.requests: {err}") from None
        if not request.wants_gpu:
            raise ClaimRequestError(PendingReason.INVALID_REQUEST,
                                    f"claim {claim.key}: spec.resources.requests asks for no GPU "
                                    "(all values are 0)")
        if request.kind not in self.kinds:
            fitting = next((p.name for p in PROVISIONERS.values() if request.kind in p.kinds), "?")
            raise ClaimRequestError(
                PendingReason.INVALID_REQUEST,
                f"claim {claim.key} asks for {describe_request(request)}, but its class's "
                f"provisioner {self.name} provisions {self.provides}; use a class whose "
                f"provisioner is {fitting}")
        return request


PROVISIONERS: dict[str, Provisioner] = {
    p.name: p for p in (
        TableProvisioner(GPUSHARE, "a share of one card (gpu-core 1-99 or gpu-tflops, and/or gpu-memory)",
                         frozenset({RequestKind.SHARE})),
        TableProvisioner(WHOLE_CARDS, "whole cards", frozenset({RequestKind.WHOLE})),
        TableProvisioner(MIG, "MIG instances", frozenset({RequestKind.MIG})),
    )
}


def describe_request(request: ContainerRequest) -> str:
    where = "one card" if request.cards == 1 else f"each of {request.cards} cards"
    if request.kind is RequestKind.SHARE and request.tflops:
        return f"a share of {where} ({request.tflops} TFLOPS, {request.memory_mib} MiB)"
    if request.kind is RequestKind.SHARE:
        return (f"a share of {where} ({request.compute_milli // 10}% compute, "
                f"{request.memory_mib} MiB)")
    if request.kind is RequestKind.WHOLE:
        return f"{request.cards} whole card(s)"
    if request.kind is RequestKind.MIG and request.mig_profile is not None:
        return f"{request.cards} MIG instance(s) of {request.mig_profile.name}"
    return "no GPU"


#: Class parameters every provisioner understands, and how each is checked.
def _check_policy(factory: Callable[[str], object]) -> Callable[[str], None]:
    def check(value: str) -> None:
        factory(value)
    return check


def _check_models(value: str) -> None:
    if not parse_model_list(value):
        raise ValueError("an empty model list; write e.g. A100|H100")


PARAMETERS: dict[str, Callable[[str], None]] = {
    "models": _check_models,
    "denyModels": _check_models,
    "nodePolicy": _check_policy(make_node_policy),
    "cardPolicy": _check_policy(make_card_policy),
}


def pod_request(claim: Claim, cls: GPUClass, container: ContainerRequest) -> PodRequest:
    """The placement request of a claim: one container, no host CPU or memory (an ElasticGPU
    holds cards only), the class's model and policy parameters."""
    for key, value in cls.parameters.items():
        check = PARAMETERS.get(key)
        if check is None:
            raise ClaimRequestError(PendingReason.INVALID_PARAMETERS,
                                    f"class {cls.name}: parameters.{key} is not a parameter of "
                                    f"{cls.provisioner} (known: {', '.join(sorted(PARAMETERS))})")
        try:
            check(value)
        except ValueError as err:
            raise ClaimRequestError(PendingReason.INVALID_PARAMETERS,
                                    f"class {cls.name}: parameters.{key}={value!r}: {err}") from None
    return PodRequest(
        name=claim.name, namespace=claim.namespace, uid=claim.uid, containers=(container,),
        allowed_models=parse_model_list(cls.parameters.get("models")),
        denied_models=parse_model_list(cls.parameters.get("denyModels")) or frozenset(),
        node_policy=cls.parameters.get("nodePolicy"), card_policy=cls.parameters.get("cardPolicy"))



def provision(decision: Provision, claim: Claim, cls: GPUClass, engine: Engine
              ) -> ElasticGPU | Pending:
    """Place the claim with the engine (on `decision.node` if set) and return the ElasticGPU
    that holds the placement, pre-bound to the claim; or Pending with the engine's reason. The
    caller records it in the engine's ledger (`ledger_key`, `egpu_assignment`) once created."""
    try:
        if decision.node is not None:
            placed = engine.assign(decision.request, decision.node)
        else:
            placed = engine.place(decision.request)
    except Unschedulable as err:
        return Pending(PendingReason.UNSCHEDULABLE, f"cannot provision claim {claim.key}: {err}")
    return ElasticGPU(name=provisioned_name(claim), capacity=dict(claim.requests), node=placed.node,
                      shares=tuple(placed.containers[CLAIM_CONTAINER]), claim_ref=ClaimRef.of(claim),
                      class_name=cls.name, reclaim_policy=cls.reclaim_policy,
                      phase=ElasticGPUPhase.BOUND)
