"""The MIG adapter's decisions: where a pending pod moves, and which moved pods go back.

Decisions (the adapter feeds them what it read from the API; which profile may stand in for
which is `profiles.compatible`):

- `choose_substitute(requested, free_instances_by_node, constraints)`: the free instance a
  pending pod moves to: the smallest compatible profile (least waste), ties by what fragments
  the cluster's MIG capacity least (`fragmentation_key`). `plan_substitutions` does it for
  several pending pods at once, each free instance given once.
- `move_back(moved, free_originals, policy, busy_nodes)`: which moved pods go back to their
  original profile now: only where safe (`restart_safe`), one at a time per node, never more
  than the free original instances.

It also reads which instances pods hold (`held_instances`) and which are free
(`free_instances`, `without`).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import AssignmentError, pod_assignment
from elastic_gpu.core.mig.profiles import compatible, mig_model
from elastic_gpu.core.model import Health, Node
from elastic_gpu.core.podlife import stopped
from elastic_gpu.core.request import PodRequest, RequestKind, pod_request_from_manifest
from elastic_gpu.core.resources import MigProfile, ResourceError

# --- choosing a substitute -------------------------------------------------------------------


@dataclass(frozen=True)
class FreeInstance:
    """A MIG instance no pod holds: where it is and what it is."""

    node: str
    card: str  # the card's uuid (or index): fragmentation is counted per card
    model: str
    profile: MigProfile
    uuid: str = ""


@dataclass(frozen=True)
class Constraints:
    """What limits where a pod may go: the card models its GPU-model annotations allow (None:
    any) and deny, matched exactly as the scheduler matches them (`PodRequest.accepts_model`),
    the nodes its node selector / affinity / taints allow (None: any), and the substitutions
    the controller's configuration allows (from profile name -> profile names; None: the
    compatibility rule alone)."""

    models: frozenset[str] | None = None
    nodes: frozenset[str] | None = None
    allowed: Mapping[str, frozenset[str]] | None = None
    denied_models: frozenset[str] = frozenset()


class NoSubstitute(enum.Enum):
    """Why a pending pod is not moved (the Event's reason)."""

    #: an instance of the profile asked is free where the pod may run: it waits for another
    #: reason (CPU, memory, ...) and moving it would not help
    REQUESTED_FREE = "RequestedProfileFree"
    #: no free instance of a compatible profile where the pod may run
    NONE_COMPATIBLE = "NoCompatibleProfileFree"


@dataclass(frozen=True)
class Substitute:
    """The decision for one pending pod: the instance it moves to, or why it does not."""

    instance: FreeInstance | None
    reason: NoSubstitute | None = None
    message: str = ""


def _may_use(inst: FreeInstance, constraints: Constraints) -> bool:
    if constraints.nodes is not None and inst.node not in constraints.nodes:
        return False
    if inst.model in constraints.denied_models:
        return False
    return constraints.models is None or inst.model in constraints.models


def fragmentation_key(inst: FreeInstance, free: Sequence[FreeInstance]) -> tuple[int, int, int]:
    """Lower is better: what taking `inst` costs the cluster's MIG capacity.

    First the scarcity of its profile (take from the profile with the most free instances of
    its model: a scarce profile stays free for the pods that need it exactly), then best fit
    (take from the card, then the node, with the fewest free compute slices: emptier cards and
    nodes stay whole for larger requests)."""
    same = sum(1 for f in free if f.profile == inst.profile and f.model == inst.model)
    card_free = sum(f.profile.slices for f in free if f.node == inst.node and f.card == inst.card)
    node_free = sum(f.profile.slices for f in free if f.node == inst.node)
    return (-same, card_free, node_free)


def choose_substitute(requested: MigProfile,
                      free_instances_by_node: Mapping[str, Sequence[FreeInstance]],
                      constraints: Constraints = Constraints()) -> Substitute:
    """The free instance a pod pending for `requested` moves to.

    Only instances where the pod may run count (`constraints`). When one of `requested`
    itself is free there, nothing moves (the pod waits for something else). Otherwise the
    smallest compatible profile wins (compute slices, then memory: least waste; a plain
    profile before its `+me` twin), ties by `fragmentation_key`, then node, card and uuid so
    that the answer never depends on the input's order."""
    free = [i for node in sorted(free_instances_by_node) for i in free_instances_by_node[node]]
    usable = [i for i in free if _may_use(i, constraints)]
    same = [i for i in usable if i.profile == requested and mig_model(i.model) is not None]
    if same:
        first = min(same, key=lambda i: (i.node, i.card, i.uuid))
        return Substitute(None, NoSubstitute.REQUESTED_FREE,
                          f"an instance of {requested.name} is free on node {first.node}; "
                          f"the pod waits for something else")
    allowed = constraints.allowed.get(requested.name) if constraints.allowed is not None else None
    candidates = [i for i in usable if compatible(requested, i.profile, i.model)
                  and (constraints.allowed is None
                       or (allowed is not None and i.profile.name in allowed))]
    if not candidates:
        return Substitute(None, NoSubstitute.NONE_COMPATIBLE,
                          f"no instance of {requested.name} nor of a compatible profile (same "
                          f"GPU family, at least {requested.slices} compute slices and "
                          f"{requested.memory_gb} GB) is free on a node the pod may use")
    best = min(candidates, key=lambda i: (i.profile.slices, i.profile.memory_gb,
                                          bool(i.profile.extra), *fragmentation_key(i, free),
                                          i.node, i.card, i.uuid))
    return Substitute(best, None, f"{requested.name} -> {best.profile.name} on node {best.node}")


@dataclass(frozen=True)
class PendingPod:
    """A pod pending for a MIG profile (oldest first is the order of service)."""

    key: str  # namespace/name
    requested: MigProfile
    constraints: Constraints = Constraints()


def mig_request(request: PodRequest) -> MigProfile | None:
    """The profile of a pod the adapter can move: one container asking one MIG instance, the
    others no GPU. None for anything else (several instances or profiles: a move would need
    them all on one node at once, which `choose_substitute` does not plan)."""
    gpu = request.gpu_containers
    if len(gpu) != 1 or gpu[0].kind is not RequestKind.MIG or gpu[0].cards != 1:
        return None
    return gpu[0].mig_profile


def constraints_for(request: PodRequest, nodes: frozenset[str] | None = None,
                    allowed: Mapping[str, frozenset[str]] | None = None) -> Constraints:
    """A pod's constraints: its models as the scheduler reads them (`PodRequest`), the nodes
    its placement rules allow (the adapter's reading of selector, affinity and taints), the
    configured substitutions."""
    return Constraints(request.allowed_models, nodes, allowed, request.denied_models)


def free_instances(nodes: Iterable[Node], held: Iterable[str]) -> dict[str, list[FreeInstance]]:
    """The MIG instances no pod holds (`held`: the instance uuids of the assignments, as the
    scheduler's ledger has them), healthy, on healthy cards, by node."""
    taken = set(held)
    out: dict[str, list[FreeInstance]] = {}
    for node in nodes:
        for card in node.cards:
            if not card.healthy:
                continue
            for inst in card.mig:
                if inst.uuid not in taken and inst.health is Health.HEALTHY:
                    out.setdefault(node.name, []).append(
                        FreeInstance(node.name, card.uuid, card.model, inst.profile, inst.uuid))
    return out


def off_nodes(free: Mapping[str, Sequence[FreeInstance]], nodes: Collection[str]
              ) -> dict[str, list[FreeInstance]]:
    """`free` less the instances on `nodes`: with dynamic MIG on, those of the opted-in nodes,
    whose free instances its planner gives out (an instance there may have just been carved
    for another waiting pod: the adapter moving a pod onto it took it from that pod, seen on
    the sandbox, and dynamic MIG carves the pod's own profile anyway)."""
    return {node: list(insts) for node, insts in free.items() if node not in nodes}


def plan_substitutions(pending: Sequence[PendingPod],
                       free_instances_by_node: Mapping[str, Sequence[FreeInstance]]
                       ) -> dict[str, Substitute]:
    """`choose_substitute` for each pending pod in order, each free instance given to one pod
    only: two pods pending and one compatible instance free, exactly one moves."""
    left = {node: list(insts) for node, insts in free_instances_by_node.items()}
    out: dict[str, Substitute] = {}
    for pod in pending:
        decision = choose_substitute(pod.requested, left, pod.constraints)
        out[pod.key] = decision
        if decision.instance is not None:
            left[decision.instance.node].remove(decision.instance)
    return out


# --- moving back -----------------------------------------------------------------------------


class MoveBackPolicy(enum.Enum):
    #: moved pods stay where they are
    NEVER = "never"
    #: a moved pod goes back when its original profile frees and the pod is idle (no work on
    #: its GPU, as the agent reports it); a busy pod is not restarted
    WHEN_IDLE = "when-idle"
    #: a moved pod goes back as soon as its original profile frees (where safe)
    ALWAYS = "always"


#: Owners that replace a deleted pod: deleting one of their pods loses nothing.
RESTARTING_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job"})


@dataclass(frozen=True)
class MovedPod:
    """A pod the adapter moved, as it runs now."""

    key: str  # namespace/name
    original: MigProfile
    current: MigProfile
    node: str
    owner_kind: str | None = None
    restart_policy: str = "Always"
    #: no work on its GPU (for `when-idle`); None: not known, counted as busy
    idle: bool | None = None
    constraints: Constraints = Constraints()


def restart_safe(pod: MovedPod) -> bool:
    """Whether deleting the pod to move it back loses nothing: an owner re-creates it, or it is
    a bare pod whose `restartPolicy: Always` says its work may restart at any time (a bare pod
    with `Never` or `OnFailure` would run its work twice)."""
    if pod.owner_kind is not None:
        return pod.owner_kind in RESTARTING_OWNERS
    return pod.restart_policy == "Always"


@dataclass(frozen=True)
class MoveBack:
    """One pod going back: to this free instance of its original profile."""

    pod: MovedPod
    instance: FreeInstance


def move_back(moved: Sequence[MovedPod], free_originals: Iterable[FreeInstance],
              policy: MoveBackPolicy, busy_nodes: frozenset[str] = frozenset()
              ) -> list[MoveBack]:
    """The moved pods that go back now, in the order given (oldest move first).

    A pod goes back only under the policy, where safe (`restart_safe`), onto a free instance
    of its original profile on a node it may use and on a card of its family. One at a time
    per node: at most one pod leaves a node and at most one arrives on a node per round, and
    no node in `busy_nodes` (a move still in flight there) is touched. Each free instance is
    given once, so never more pods go back than there are free originals."""
    if policy is MoveBackPolicy.NEVER:
        return []
    left = list(free_originals)
    touched = set(busy_nodes)
    out: list[MoveBack] = []
    for pod in moved:
        if pod.node in touched or not restart_safe(pod):
            continue
        if policy is MoveBackPolicy.WHEN_IDLE and pod.idle is not True:
            continue
        fits = [i for i in left if i.profile == pod.original and i.node not in touched
                and _may_use(i, pod.constraints) and mig_model(i.model) is not None]
        if not fits:
            continue
        # back onto its own node when it can (nothing else moves), else the best fit
        target = min(fits, key=lambda i: (i.node != pod.node, *fragmentation_key(i, left),
                                          i.node, i.card, i.uuid))
        left.remove(target)
        touched.update({pod.node, target.node})
        out.append(MoveBack(pod, target))
    return out


# --- what the controller reads and does with its rules -----------------------------------------


@dataclass(frozen=True)
class BoundPod:
    """A pod placed on a node that may hold MIG instances: the instance uuids its assignment
    names (the extender's ledger), and the MIG profiles it asks that no assignment names (a
    pod placed without the extender: it holds *an* instance of each on its node)."""

    node: str
    mig_uuids: tuple[str, ...] = ()
    unassigned: tuple[MigProfile, ...] = ()


def bound_pod(pod: Mapping[str, Any]) -> BoundPod | None:
    """What a pod object may hold of MIG instances (None: nothing). A pod being deleted holds
    its instances until its containers have stopped (`core.podlife.stopped`), as the extender
    counts it; a pod its assignment places holds what the assignment names; a pod placed
    without one, an instance of each MIG profile it asks."""
    if stopped(pod):
        return None
    meta = pod.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    notes = notes if isinstance(notes, Mapping) else {}
    spec = pod.get("spec")
    node = (spec.get("nodeName") if isinstance(spec, Mapping) else None) \
        or notes.get(ann.ASSIGNED_NODE)
    if notes.get(ann.ASSIGNMENT):
        try:
            assignment = pod_assignment(pod)
        except AssignmentError:
            assignment = None
        if assignment is not None:
            return BoundPod(assignment.node, tuple(
                s.mig_uuid for s in assignment.shares() if s.mig_uuid))
    if not node:
        return None
    try:
        request = pod_request_from_manifest(pod)
    except (ResourceError, ValueError):
        return None
    profiles = tuple(c.mig_profile for c in request.gpu_containers
                     if c.kind is RequestKind.MIG and c.mig_profile is not None
                     for _ in range(max(1, c.cards)))
    return BoundPod(str(node), (), profiles) if profiles else None


def held_instances(nodes: Iterable[Node], bound: Iterable[BoundPod]) -> set[str]:
    """The uuids of the MIG instances pods hold: those their assignments name, and for each
    profile a pod asks without an assignment, the first instance of it on its node (by uuid)
    no one else holds, as the device plugin would give one."""
    held: set[str] = set()
    pods = list(bound)
    for pod in pods:
        held.update(pod.mig_uuids)
    by_node = {n.name: n for n in nodes}
    for pod in pods:
        node = by_node.get(pod.node)
        if node is None:
            continue
        for profile in pod.unassigned:
            free = sorted(i.uuid for c in node.cards for i in c.mig
                          if i.profile == profile and i.uuid not in held)
            if free:
                held.add(free[0])
    return held


def without(free_by_node: Mapping[str, Sequence[FreeInstance]], taken: Iterable[str]
            ) -> dict[str, list[FreeInstance]]:
    """`free_by_node` less the instances whose uuid is in `taken` (reserved by moves in
    flight)."""
    drop = set(taken)
    return {node: [i for i in insts if i.uuid not in drop]
            for node, insts in free_by_node.items()}

