"""The Elastic GPU API's objects as the pure decisions read them: ElasticGPUClass (`GPUClass`),
ElasticGPUClaim (`Claim`), ElasticGPU, their phases and the claim's Bound condition.

ElasticGPUClass ~ StorageClass, ElasticGPUClaim ~ PersistentVolumeClaim, ElasticGPU ~
PersistentVolume; the Kubernetes persistent-volume controller is the model (DESIGN.md 7.1).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from elastic_gpu.core.assignment import CardShare

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



#: The condition type every claim carries: whether it is bound, and if not, why.
BOUND_CONDITION = "Bound"


@dataclass(frozen=True)
class Condition:
    """A `metav1.Condition` without its times (the adapter adds lastTransitionTime)."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str  # CamelCase
    message: str


def provisioned_name(claim: Claim) -> str:
    return f"{PROVISIONED_PREFIX}{claim.uid}"
