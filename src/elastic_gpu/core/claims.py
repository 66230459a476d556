"""Claims: the pure decisions of the Elastic GPU API (binding, provisioning, reclaiming). No I/O.

ElasticGPUClass ~ StorageClass, ElasticGPUClaim ~ PersistentVolumeClaim, ElasticGPU ~
PersistentVolume; the Kubernetes persistent-volume controller is the model (DESIGN.md 7.1).
The controller (`elastic_gpu.controller.claims`, an adapter) feeds these functions what the
API says and carries out what they return:

- `decide(claim, classes, egpus, consumer_node)` -> one of `InSync` (nothing to do), `Bind`
  (make claim and ElasticGPU point at each other: static binding to a named ElasticGPU, or
  finishing a provisioning interrupted between its writes), `Provision` (a provisioner
  plug-in turned the claim into a placement request), `Pending` (a structured reason and a
  message), `Lost` (a bound claim whose ElasticGPU is gone or bound elsewhere);
- `provision(decision, claim, cls, engine)` -> the ElasticGPU to create, placed by the same
  engine that places pods (so its cards are counted like a pod's), or `Pending` with the
  engine's reason;
- `decide_release(egpu, claim)` -> `Keep`, `MarkReleased` (Retain) or `DeleteElasticGPU`
  (Delete) once the claim it was bound to is gone.

Provisioners are plug-ins behind `Provisioner` (`PROVISIONERS`, keyed by the class's
`provisioner`): the fractional share of one card the seed names
(`gpushare.provisioner.elasticgpu.io`), whole cards (`gpu.provisioner.elasticgpu.io`) and MIG
instances (`mig.provisioner.elasticgpu.io`). Each reads the claim's requests through the one
resource table (`core.request.container_request`), so a claim means what a pod's container
with the same resources means.

An ElasticGPU holds its cards exactly as a bound pod's assignment does: `egpu_assignment`
gives the `Assignment` the scheduler's ledger counts under `ledger_key(name)`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastic_gpu.core import podlife
from elastic_gpu.core.annotations import ASSIGNMENT, CLAIM_PREFIX
from elastic_gpu.core.assignment import Assignment, AssignmentError, CardShare
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

#: The container name an ElasticGPU's shares are filed under in its `Assignment`.
CLAIM_CONTAINER = "egpu"
#: Prefix of the names of provisioned ElasticGPUs: egpu-<claim uid>, like a PV's pvc-<uid>. A
#: deterministic name makes provisioning idempotent: a retried create meets AlreadyExists.
PROVISIONED_PREFIX = "egpu-"

GPUSHARE = "gpushare.provisioner.elasticgpu.io"
WHOLE_CARDS = "gpu.provisioner.elasticgpu.io"
MIG = "mig.provisioner.elasticgpu.io"


class ReclaimPolicy(enum.Enum):
    RETAIN = "Retain"
    DELETE = "Delete"


class BindingMode(enum.Enum):
    IMMEDIATE = "Immediate"
    WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


class ClaimPhase(enum.Enum):
    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"


class ElasticGPUPhase(enum.Enum):
    #: not looked at yet: an ElasticGPU without a status (a pre-created one is checked against
    #: the GPUDevice inventory before it becomes Available, `inventory_problem`)
    PENDING = "Pending"
    AVAILABLE = "Available"
    BOUND = "Bound"
    RELEASED = "Released"
    FAILED = "Failed"


class PendingReason(enum.Enum):
    """Why a claim stays Pending: the `reason` of its condition and Event (CamelCase)."""

    CLASS_NOT_SET = "ClassNotSet"
    CLASS_NOT_FOUND = "ClassNotFound"
    PROVISIONER_UNKNOWN = "ProvisionerUnknown"
    INVALID_PARAMETERS = "InvalidParameters"
    INVALID_REQUEST = "InvalidRequest"
    WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
    UNSCHEDULABLE = "Unschedulable"
    ELASTICGPU_NOT_FOUND = "ElasticGPUNotFound"
    ELASTICGPU_BOUND_ELSEWHERE = "ElasticGPUBoundElsewhere"
    ELASTICGPU_NOT_AVAILABLE = "ElasticGPUNotAvailable"
    ELASTICGPU_TOO_SMALL = "ElasticGPUTooSmall"
    CLASS_MISMATCH = "ClassMismatch"


class LostReason(enum.Enum):
    ELASTICGPU_MISSING = "ElasticGPUMissing"
    ELASTICGPU_BOUND_ELSEWHERE = "ElasticGPUBoundElsewhere"


@dataclass(frozen=True)
class GPUClass:
    name: str
    provisioner: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    reclaim_policy: ReclaimPolicy = ReclaimPolicy.DELETE
    binding_mode: BindingMode = BindingMode.IMMEDIATE


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    class_name: str | None
    #: resource name -> value, as written (an int or a quantity string)
    requests: Mapping[str, int | str]
    elastic_gpu_name: str | None = None
    phase: ClaimPhase = ClaimPhase.PENDING
    deleting: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    #: "" for an ElasticGPU pre-bound by name only (any claim of that name may take it)
    uid: str = ""

    def matches(self, claim: Claim) -> bool:
        return (self.namespace, self.name) == (claim.namespace, claim.name) and \
            self.uid in ("", claim.uid)

    @staticmethod
    def of(claim: Claim) -> ClaimRef:
        return ClaimRef(claim.namespace, claim.name, claim.uid)


@dataclass(frozen=True)
class ElasticGPU:
    name: str
    capacity: Mapping[str, int | str]
    node: str
    shares: tuple[CardShare, ...]
    claim_ref: ClaimRef | None = None
    class_name: str | None = None
    reclaim_policy: ReclaimPolicy = ReclaimPolicy.RETAIN
    phase: ElasticGPUPhase = ElasticGPUPhase.AVAILABLE


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


#: The condition type every claim carries: whether it is bound, and if not, why.
BOUND_CONDITION = "Bound"


@dataclass(frozen=True)
class Condition:
    """A `metav1.Condition` without its times (the adapter adds lastTransitionTime)."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str  # CamelCase
    message: str


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
        TableProvisioner(GPUSHARE, "a share of one card (gpu-core 1-99 and/or gpu-memory)",
                         frozenset({RequestKind.SHARE})),
        TableProvisioner(WHOLE_CARDS, "whole cards", frozenset({RequestKind.WHOLE})),
        TableProvisioner(MIG, "MIG instances", frozenset({RequestKind.MIG})),
    )
}


def describe_request(request: ContainerRequest) -> str:
    if request.kind is RequestKind.SHARE:
        return (f"a share of one card ({request.compute_milli // 10}% compute, "
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


def provisioned_name(claim: Claim) -> str:
    return f"{PROVISIONED_PREFIX}{claim.uid}"


def _bound_decision(claim: Claim, egpu: ElasticGPU) -> InSync | Bind:
    if claim.phase is ClaimPhase.BOUND and claim.elastic_gpu_name == egpu.name and \
            egpu.phase is ElasticGPUPhase.BOUND and egpu.claim_ref == ClaimRef.of(claim):
        return InSync(egpu.name)
    return Bind(egpu.name)


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


# --------------------------------------------------------------------------- release


@dataclass(frozen=True)
class Keep:
    """Release decision: leave the ElasticGPU as it is (its claim still exists, it is already
    Released or Failed, it waits for a claim pre-bound by name, or its claim is gone but pods
    still use its cards: `waiting_for`)."""

    #: the pods (namespace/name) still using it, when that is why it is kept
    waiting_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class MarkReleased:
    """Retain: the ElasticGPU stays, holding its cards, phase Released, until deleted."""

    message: str


@dataclass(frozen=True)
class DeleteElasticGPU:
    """Delete: the ElasticGPU is deleted, and its cards freed with it."""

    message: str


ReleaseDecision = Keep | MarkReleased | DeleteElasticGPU


def decide_release(egpu: ElasticGPU, claim: Claim | None,
                   holders: Iterable[str] = ()) -> ReleaseDecision:
    """What to do with an ElasticGPU given the claim its claimRef names (None: no such claim,
    or one of another uid, i.e. deleted and re-created) and the pods still using its cards
    (`pods_holding`): never released nor deleted while one is left, whatever became of the
    claim."""
    ref = egpu.claim_ref
    if ref is None or egpu.phase in (ElasticGPUPhase.RELEASED, ElasticGPUPhase.FAILED):
        return Keep()
    if claim is not None and ref.matches(claim):
        return Keep()
    if not ref.uid and egpu.phase in (ElasticGPUPhase.AVAILABLE, ElasticGPUPhase.PENDING):
        return Keep()  # pre-bound by name to a claim not created yet
    waiting = tuple(sorted(holders))
    if waiting:
        return Keep(waiting)
    message = f"claim {ref.namespace}/{ref.name} was deleted"
    if egpu.reclaim_policy is ReclaimPolicy.DELETE:
        return DeleteElasticGPU(message)
    return MarkReleased(f"{message}; reclaim policy Retain: delete the ElasticGPU to free its cards")


# --------------------------------------------------------------------------- the inventory


class InventoryReason(enum.Enum):
    """Why a pre-created ElasticGPU is `Failed`: its `status.reason`."""

    NODE_NOT_FOUND = "NodeNotFound"
    CARD_NOT_FOUND = "CardNotFound"
    UUID_MISMATCH = "UUIDMismatch"
    MIG_INSTANCE_NOT_FOUND = "MIGInstanceNotFound"


INVENTORY_REASONS = frozenset(r.value for r in InventoryReason)


@dataclass(frozen=True)
class InventoryCard:
    """What the GPUDevice inventory says of one card: its uuid and its MIG instances' uuids."""

    uuid: str
    mig_uuids: frozenset[str] = frozenset()


def checked_against_inventory(egpu: ElasticGPU) -> bool:
    """Whether `egpu` is checked against the inventory: one an administrator created (not
    pre-bound to one claim's uid, as the extender provisions them), until it is bound."""
    ref = egpu.claim_ref
    return (ref is None or not ref.uid) and egpu.phase in (
        ElasticGPUPhase.PENDING, ElasticGPUPhase.AVAILABLE, ElasticGPUPhase.FAILED)


def inventory_problem(egpu: ElasticGPU, inventory: Mapping[str, Mapping[int, InventoryCard]]
                      ) -> tuple[InventoryReason, str] | None:
    """Why a pre-created ElasticGPU does not name real cards (None: it does). `inventory`:
    node -> card index -> card, from the GPUDevices the agents publish. Its node must have
    GPUDevices, each card it names a GPUDevice at that index with that uuid, and each MIG
    instance it names one of that card's: an ElasticGPU naming card 999, a node that does not
    exist or another card's uuid would hand a pod a device that is not there, or someone
    else's."""
    where = f"ElasticGPU {egpu.name}"
    cards = inventory.get(egpu.node)
    if not cards:
        return (InventoryReason.NODE_NOT_FOUND,
                f"{where}: node {egpu.node!r} has no GPUDevice (no such node, or no agent "
                "reports its cards)")
    for share in egpu.shares:
        card = cards.get(share.index)
        if card is None:
            known = ", ".join(str(i) for i in sorted(cards))
            return (InventoryReason.CARD_NOT_FOUND,
                    f"{where}: node {egpu.node} has no card at index {share.index} "
                    f"(its cards: {known})")
        if share.uuid != card.uuid:
            return (InventoryReason.UUID_MISMATCH,
                    f"{where}: card {share.index} of node {egpu.node} is {card.uuid}, not "
                    f"{share.uuid}")
        if share.mig_uuid is not None and share.mig_uuid not in card.mig_uuids:
            return (InventoryReason.MIG_INSTANCE_NOT_FOUND,
                    f"{where}: card {share.index} of node {egpu.node} has no MIG instance "
                    f"{share.mig_uuid}")
    return None


# --------------------------------------------------------------------------- ledger


def ledger_key(egpu_name: str) -> str:
    """The engine-ledger key of an ElasticGPU (never a pod key: those are namespace/name)."""
    return f"elasticgpu:{egpu_name}"


def egpu_assignment(egpu: ElasticGPU) -> Assignment:
    """The cards an ElasticGPU holds, as the assignment the scheduler's ledger counts. Released
    ones hold their cards too (Retain); only deletion frees them."""
    return Assignment(egpu.node, {CLAIM_CONTAINER: egpu.shares})


# --------------------------------------------------------------------------- pods


class ClaimAnnotationError(ValueError):
    """A pod's egpuc.elasticgpu.io/* annotations that cannot be read; the message names the
    annotation, the value and the rule (the webhook's refusal)."""


_CLAIM_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def pod_claims(pod: Mapping[str, Any]) -> dict[str, str]:
    """container name -> claim name, from the pod's `egpuc.elasticgpu.io/<container>: <claim>`
    annotations (the claims are in the pod's namespace). A key whose suffix names no container
    means the only container of a one-container pod (the seed README writes `test1` on a
    container `test-cuda`); with several containers it is an error that says so."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    containers = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or []
                  if isinstance(c, Mapping)]
    out: dict[str, str] = {}
    for key in sorted(k for k in annotations if isinstance(k, str) and k.startswith(CLAIM_PREFIX)):
        value = annotations[key]
        suffix = key[len(CLAIM_PREFIX):]
        if not isinstance(value, str) or len(value) > 253 or not _CLAIM_NAME.match(value):
            raise ClaimAnnotationError(f"annotation {key}={value!r}: the value must name an "
                                       "ElasticGPUClaim of the pod's namespace (a DNS subdomain)")
        if suffix in containers:
            container = suffix
        elif len(containers) == 1:
            container = containers[0]
        else:
            raise ClaimAnnotationError(
                f"annotation {key}={value}: the pod has containers {', '.join(containers) or 'none'}"
                f" and none is named {suffix!r}; write {CLAIM_PREFIX}<container>: <claim>")
        if container in out:
            raise ClaimAnnotationError(
                f"annotation {key}={value}: container {container} already uses claim "
                f"{out[container]}; a container uses at most one claim")
        out[container] = value
    return out


#: The finalizer on every claim (a PVC's kubernetes.io/pvc-protection), from its creation (the
#: webhook's `protection_patch`; the controller adds it to one created without): a claim
#: deleted while a pod uses it stays (deletionTimestamp set) until no pod that names it is
#: left running.
CLAIM_PROTECTION_FINALIZER = "elasticgpu.io/claim-protection"


def protection_patch(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch that gives a claim being created the claim-protection finalizer (the
    webhook's, at CREATE, whoever creates it: a PVC gets `kubernetes.io/pvc-protection` the
    same way), empty when it has it. Other finalizers are kept."""
    meta = claim.get("metadata")
    finalizers = meta.get("finalizers") if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping):
        return [{"op": "add", "path": "/metadata",
                 "value": {"finalizers": [CLAIM_PROTECTION_FINALIZER]}}]
    if not isinstance(finalizers, list):
        return [{"op": "add", "path": "/metadata/finalizers",
                 "value": [CLAIM_PROTECTION_FINALIZER]}]
    if CLAIM_PROTECTION_FINALIZER in finalizers:
        return []
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": CLAIM_PROTECTION_FINALIZER}]


def _named_claims(pod: Mapping[str, Any]) -> set[str]:
    """The claims a pod's annotations name; one whose annotations cannot be read names every
    claim any of its claim annotations mentions (the safe side: its cards may be in use)."""
    try:
        return set(pod_claims(pod).values())
    except ClaimAnnotationError:
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        return {v for k, v in notes.items()
                if isinstance(k, str) and k.startswith(CLAIM_PREFIX) and isinstance(v, str)}


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name')}"


def pods_using(claim: Claim, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pods (namespace/name) of the claim's namespace that name it and have not stopped
    (`core.podlife.stopped`: a terminal phase, or deleted with every container terminated;
    a Pending pod counts): while any is left, the claim's finalizer stays."""
    return sorted(_pod_key(pod) for pod in pods
                  if (pod.get("metadata") or {}).get("namespace", "default") == claim.namespace
                  and not podlife.stopped(pod) and claim.name in _named_claims(pod))


def pods_holding(egpu: ElasticGPU, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pods (namespace/name) that have not stopped and use the ElasticGPU's cards: their
    assignment's `claims` name it, or their annotations name the claim its claimRef names.
    While any is left it is neither released nor deleted (issue #26: a claim whose finalizer
    was missing or removed must not take the card from under its pod). An assignment that
    cannot be read counts if its text mentions the ElasticGPU (the safe side)."""
    ref = egpu.claim_ref
    out = []
    for pod in pods:
        if podlife.stopped(pod):
            continue
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(ASSIGNMENT)
        uses = False
        if isinstance(text, str) and text:
            try:
                uses = egpu.name in Assignment.from_json(text).claims.values()
            except AssignmentError:
                uses = egpu.name in text
        if not uses and ref is not None and meta.get("namespace", "default") == ref.namespace:
            uses = ref.name in _named_claims(pod)
        if uses:
            out.append(_pod_key(pod))
    return sorted(out)


# --------------------------------------------------------------------------- pods that name claims


def bound_elasticgpu(claim: Claim, egpus: Mapping[str, ElasticGPU]) -> ElasticGPU | None:
    """The ElasticGPU whose cards a pod naming `claim` uses: the one the claim is bound to
    (`spec.elasticGPUName`), or the provisioned `egpu-<uid>` pre-bound to it (provisioning
    done, the controller has not written the claim yet); its claimRef must name the claim.
    None while the claim is not bound."""
    name = claim.elastic_gpu_name or provisioned_name(claim)
    egpu = egpus.get(name)
    if egpu is None or egpu.claim_ref is None or not egpu.claim_ref.matches(claim):
        return None
    if egpu.phase in (ElasticGPUPhase.RELEASED, ElasticGPUPhase.FAILED) or not egpu.node:
        return None
    return egpu


@dataclass(frozen=True)
class PodClaims:
    """How a pod's claim-backed containers are placed (`resolve_pod_claims`).

    - `bound`: container -> the ElasticGPU it uses (node and cards fixed);
    - `first_consumer`: container -> an unbound WaitForFirstConsumer claim, provisioned on the
      node the pod is bound to, with the cards chosen for that container;
    - `blocked`: why no node can take the pod now (a claim missing, Pending, being deleted,
      or bound ElasticGPUs on different nodes); None if it can be placed;
    - `waits_for`: the claims (namespace/name) whose change may unblock it.
    """

    bound: Mapping[str, ElasticGPU] = field(default_factory=dict)
    first_consumer: Mapping[str, Claim] = field(default_factory=dict)
    blocked: str | None = None
    waits_for: frozenset[str] = frozenset()

    @property
    def node(self) -> str | None:
        """The node the pod must go to: its bound ElasticGPUs' (None: any)."""
        return next((e.node for e in self.bound.values()), None)

    def marks(self) -> dict[str, str]:
        """The assignment's `claims` mark: container -> ElasticGPU name (bound ones; the
        first-consumer ones get theirs when provisioned, `provisioned_name`)."""
        out = {c: e.name for c, e in self.bound.items()}
        out.update({c: provisioned_name(claim) for c, claim in self.first_consumer.items()})
        return out


def _pending(claim: Claim, message: str) -> str:
    return f"ElasticGPUClaim {claim.key} is Pending: {message}"


def resolve_pod_claims(namespace: str, named: Mapping[str, str],
                       claims: Mapping[tuple[str, str], Claim],
                       classes: Mapping[str, GPUClass],
                       egpus: Mapping[str, ElasticGPU]) -> PodClaims:
    """Place the claim-backed containers of a pod of `namespace` whose containers name claims
    (`named`: container -> claim name, from `pod_claims`), given what the API says."""
    bound: dict[str, ElasticGPU] = {}
    first: dict[str, Claim] = {}
    blocked: list[str] = []
    waits: set[str] = set()
    for container, claim_name in sorted(named.items()):
        claim = claims.get((namespace, claim_name))
        key = f"{namespace}/{claim_name}"
        if claim is None:
            blocked.append(f"ElasticGPUClaim {key} does not exist")
            waits.add(key)
            continue
        if claim.deleting:
            blocked.append(f"ElasticGPUClaim {key} is being deleted")
            continue
        egpu = bound_elasticgpu(claim, egpus)
        if egpu is not None:
            bound[container] = egpu
            continue
        waits.add(key)
        decision = decide(claim, classes, egpus)
        if isinstance(decision, Pending) and \
                decision.reason is PendingReason.WAIT_FOR_FIRST_CONSUMER:
            first[container] = claim
        elif isinstance(decision, Pending | Lost):
            blocked.append(_pending(claim, decision.message))
        elif isinstance(decision, Provision):
            blocked.append(_pending(claim, f"not bound yet; its class provisions it when the "
                                    f"claim is created ({decision.provisioner})"))
        else:
            blocked.append(_pending(claim, f"not bound yet (ElasticGPU {decision.elastic_gpu} "
                                    "is being bound to it)"))
    for claim_name in sorted({c.name for c in first.values()}):
        sharing = sorted(c for c, claim in first.items() if claim.name == claim_name)
        if len(sharing) > 1:
            blocked.append(f"ElasticGPUClaim {namespace}/{claim_name} (WaitForFirstConsumer) is "
                           f"named by containers {', '.join(sharing)}; until it is bound, one "
                           "container of a pod may name it")
    nodes = sorted({e.node for e in bound.values()})
    if len(nodes) > 1:
        blocked.append("the pod's claims are bound to ElasticGPUs on different nodes ("
                       + ", ".join(f"{c}: {e.name} on {e.node}" for c, e in sorted(bound.items()))
                       + "); a pod runs on one node")
    return PodClaims(bound, first, "; ".join(blocked) or None, frozenset(waits))


def off_node_reason(container: str, claim_key: str, egpu: ElasticGPU) -> str:
    """A node other than the bound ElasticGPU's, in the filter's answer."""
    return f"ElasticGPUClaim {claim_key} is bound to ElasticGPU {egpu.name} on node {egpu.node}"


def first_consumer_elasticgpu(claim: Claim, cls: GPUClass, node: str,
                              shares: tuple[CardShare, ...]) -> ElasticGPU:
    """The ElasticGPU a WaitForFirstConsumer claim gets when its first pod is bound to `node`,
    holding the cards chosen for that pod's container (pre-bound to the claim, like
    `provision`'s)."""
    return ElasticGPU(name=provisioned_name(claim), capacity=dict(claim.requests), node=node,
                      shares=shares, claim_ref=ClaimRef.of(claim), class_name=cls.name,
                      reclaim_policy=cls.reclaim_policy, phase=ElasticGPUPhase.BOUND)
