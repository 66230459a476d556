"""Who the defragmentation controller may move, and who it makes room for. Pure.

A move is an eviction: the pod's owner re-creates it and the scheduler places the new pod
elsewhere. So a pod may move only when (all of):
- a controller owner re-creates it (`RECREATING_OWNERS`): a bare pod would simply be gone;
- it is opted in: its namespace is one the configuration names, or it carries the label
  `elasticgpu.io/movable: "true"`; the label `"false"` keeps it even in such a namespace;
- its priority is not higher than the pending pod's (making room for less important work
  must never disturb more important work);
- its owner has not had a pod moved within the cool-down (the owner, not the pod: the moved
  pod's replacement is a new pod with the same owner), and no PodDisruptionBudget refused its
  eviction within the cool-down (the controller does not knock again and again);
- it is bound, holds cards, uses no ElasticGPUClaim (a claim's cards are the claim's: evicting
  the pod frees nothing) and is not being deleted.

A pod is made room for when it waits for capacity: not bound, Pending, not being deleted, and
kube-scheduler marked it `PodScheduled=False` with reason `Unschedulable`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.annotations import MOVABLE_LABEL

#: Controller owners that re-create a pod evicted from under them.
RECREATING_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job"})


class NotMovable(enum.Enum):
    """Why a pod may not move (the value is the sentence Events and logs show)."""

    BARE = "no controller owner re-creates it"
    OWNER_KIND = "its owner does not re-create evicted pods (only ReplicaSet, StatefulSet, Job)"
    NOT_OPTED_IN = ("not opted in (neither label elasticgpu.io/movable=true nor a movable "
                    "namespace)")
    OPTED_OUT = "labelled elasticgpu.io/movable=false"
    HIGHER_PRIORITY = "its priority is higher than the pending pod's"
    COOLING_DOWN = "its owner had a pod moved within the cool-down"
    REFUSED = "a PodDisruptionBudget refused its eviction within the cool-down"
    NOT_PLACED = "not bound, holds no cards, or is being deleted"
    CLAIM = "it uses an ElasticGPUClaim (the claim holds its cards)"


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class PodFacts:
    """What the rules read of a pod."""

    namespace: str
    name: str
    uid: str
    #: the controller owner (ownerReferences with controller: true), None for a bare pod
    owner: Owner | None
    #: the value of the label elasticgpu.io/movable, None without it
    movable_label: str | None
    priority: int
    node: str
    deleting: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def controller_owner(meta: Mapping[str, Any]) -> Owner | None:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return Owner(str(ref.get("kind", "")), str(ref.get("name", "")),
                         str(ref.get("uid", "")))
    return None


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The facts of a pod object (missing fields read as empty, never an error)."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    labels = _mapping(meta.get("labels"))
    label = labels.get(MOVABLE_LABEL)
    priority = spec.get("priority")
    return PodFacts(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")), owner=controller_owner(meta),
        movable_label=label if isinstance(label, str) else None,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        node=str(spec.get("nodeName") or ""), deleting=bool(meta.get("deletionTimestamp")))


@dataclass(frozen=True)
class MoveRules:
    """The configuration's part in who may move."""

    #: every pod (with a re-creating owner) of these namespaces may move
    movable_namespaces: frozenset[str] = frozenset()
    cool_down_s: float = 600.0


@dataclass(frozen=True)
class Memory:
    """What the controller remembers of earlier moves (times on one monotonic clock)."""

    #: owner uid -> when a pod of it was last evicted
    moved_at: Mapping[str, float]
    #: pod uid -> when a PodDisruptionBudget last refused its eviction
    refused_at: Mapping[str, float]


def why_not_movable(pod: PodFacts, *, holds_cards: bool, uses_claim: bool,
                    pending_priority: int, rules: MoveRules, memory: Memory, now: float
                    ) -> NotMovable | None:
    """None when `pod` may be moved to make room for a pending pod of `pending_priority`,
    else the first reason it may not (in the module docstring's order)."""
    if pod.owner is None:
        return NotMovable.BARE
    if pod.owner.kind not in RECREATING_OWNERS:
        return NotMovable.OWNER_KIND
    if pod.movable_label == "false":
        return NotMovable.OPTED_OUT
    if pod.movable_label != "true" and pod.namespace not in rules.movable_namespaces:
        return NotMovable.NOT_OPTED_IN
    if pod.priority > pending_priority:
        return NotMovable.HIGHER_PRIORITY
    moved = memory.moved_at.get(pod.owner.uid)
    if moved is not None and now - moved < rules.cool_down_s:
        return NotMovable.COOLING_DOWN
    refused = memory.refused_at.get(pod.uid)
    if refused is not None and now - refused < rules.cool_down_s:
        return NotMovable.REFUSED
    if not pod.node or pod.deleting or not holds_cards:
        return NotMovable.NOT_PLACED
    if uses_claim:
        return NotMovable.CLAIM
    return None


def waiting_for_capacity(pod: Mapping[str, Any]) -> bool:
    """kube-scheduler found no node for the pod: unbound, Pending, not being deleted, and
    its PodScheduled condition False for reason Unschedulable."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    status = _mapping(pod.get("status"))
    if spec.get("nodeName") or meta.get("deletionTimestamp"):
        return False
    if status.get("phase", "Pending") != "Pending":
        return False
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return False
    return any(isinstance(c, Mapping) and c.get("type") == "PodScheduled"
               and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in conditions)
