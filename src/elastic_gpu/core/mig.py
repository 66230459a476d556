"""MIG profiles per GPU model, and the MIG adapter's decisions (DESIGN.md 7.3). Pure, no I/O.

The table is NVIDIA's, as the MIG user guide publishes it ("Supported MIG Profiles",
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, and
"Supported GPUs" for the models and their 7 (A30: 4) instances at most): per profile the
compute slices (fraction of SMs), the memory slices (fraction of memory, in eighths; A30 in
quarters), the memory in GB its name gives and how many instances of it one card holds. The
A100-SXM4-80GB and the H100 80 GB carry the same names (1g.10gb ... 7g.80gb) and sizes; the H200
141 GB carries 1g.18gb ... 7g.141gb. The `+me` profiles (media extensions) exist once per card.
The H100-80GB and H200-141GB rows (names and instances per card) were cross-checked against
NVIDIA's own MIG partition editor defaults (NVIDIA/mig-parted,
deployments/systemd/config-default.yaml: `all-1g.10gb` 7, `all-1g.20gb` 4, `all-2g.20gb` 3,
`all-3g.40gb` 2, `all-4g.40gb` 1, `all-7g.80gb` 1 for H100-80GB; `all-1g.18gb` 7,
`all-1g.35gb` 4, `all-2g.35gb` 3, `all-3g.71gb` 2, `all-4g.71gb` 1, `all-7g.141gb` 1 for
H200-141GB; one `+me` each).

Decisions (the adapter feeds them what it read from the API):

- `compatible(requested, offered, model)`: may a pod asking `requested` run on an instance of
  `offered` carved on a card of `model`? Same model family, at least the compute slices and the
  memory asked, a different profile (the same one is no substitution).
- `choose_substitute(requested, free_instances_by_node, constraints)`: the free instance a
  pending pod moves to: the smallest compatible profile (least waste), ties by what fragments
  the cluster's MIG capacity least (`fragmentation_key`). `plan_substitutions` does it for
  several pending pods at once, each free instance given once.
- `move_back(moved, free_originals, policy, busy_nodes)`: which moved pods go back to their
  original profile now: only where safe (`restart_safe`), one at a time per node, never more
  than the free original instances.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.annotations import MANAGED_BY
from elastic_gpu.core.model import Health, Node
from elastic_gpu.core.request import PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

#: The annotation that records a pod's request as its user wrote it before the adapter moved
#: it (`<container>=<profile>` pairs separated by commas), and the rule that moved it.
MIG_ORIGINAL = ann.MIG_ORIGINAL
MIG_SUBSTITUTION = ann.MIG_SUBSTITUTION
#: On a MIGSubstitution (metadata): the rule's pods are going back to their original profile;
#: the rule selects no pod any more (the webhook leaves them as written) and is kept only for a
#: bare pod's saved manifest until the pod is re-created (then it is deleted).
MIG_RETURNING = ann.MIG_RETURNING
#: The value of `annotations.MANAGED_BY` on the rules the MIG adapter writes.
ADAPTER = "elastic-gpu-mig-adapter"


@dataclass(frozen=True)
class ProfileSize:
    """One row of NVIDIA's table: a profile and its size on one card model."""

    profile: MigProfile
    #: compute slices (the profile's `<n>g`; a card has `MigModel.compute_slices`)
    compute_slices: int
    #: memory slices (of `MigModel.memory_slices`)
    memory_slices: int
    #: how many instances of this profile one card holds at most
    max_instances: int

    @property
    def memory_gb(self) -> int:
        return self.profile.memory_gb


@dataclass(frozen=True)
class MigModel:
    """A MIG-capable card model and its profiles."""

    name: str
    #: the product family: substitution never crosses it (A100 40 GB and 80 GB are one family)
    family: str
    memory_gb: int
    compute_slices: int
    memory_slices: int
    profiles: tuple[ProfileSize, ...]

    def size(self, profile: MigProfile) -> ProfileSize | None:
        return next((p for p in self.profiles if p.profile == profile), None)


def _rows(*rows: tuple[str, int, int]) -> tuple[ProfileSize, ...]:
    out = []
    for name, memory_slices, max_instances in rows:
        profile = MigProfile.parse(name)
        out.append(ProfileSize(profile, profile.slices, memory_slices, max_instances))
    return tuple(out)


#: The 80 GB Ampere/Hopper layout: the A100-SXM4-80GB (and PCIe 80 GB) and the H100 80 GB.
_EIGHTY = (("1g.10gb", 1, 7), ("1g.10gb+me", 1, 1), ("1g.20gb", 2, 4), ("2g.20gb", 2, 3),
           ("3g.40gb", 4, 2), ("4g.40gb", 4, 1), ("7g.80gb", 8, 1))

#: NVIDIA's published profiles per model (see the module's docstring for the source).
MIG_MODELS: tuple[MigModel, ...] = (
    MigModel("A30-24GB", "A30", 24, 4, 4, _rows(
        ("1g.6gb", 1, 4), ("1g.6gb+me", 1, 1), ("2g.12gb", 2, 2), ("2g.12gb+me", 2, 1),
        ("4g.24gb", 4, 1))),
    MigModel("A100-SXM4-40GB", "A100", 40, 7, 8, _rows(
        ("1g.5gb", 1, 7), ("1g.5gb+me", 1, 1), ("1g.10gb", 2, 4), ("2g.10gb", 2, 3),
        ("3g.20gb", 4, 2), ("4g.20gb", 4, 1), ("7g.40gb", 8, 1))),
    MigModel("A100-80GB", "A100", 80, 7, 8, _rows(*_EIGHTY)),
    MigModel("H100-80GB", "H100", 80, 7, 8, _rows(*_EIGHTY)),
    MigModel("H200-141GB", "H200", 141, 7, 8, _rows(
        ("1g.18gb", 1, 7), ("1g.18gb+me", 1, 1), ("1g.35gb", 2, 4), ("2g.35gb", 2, 3),
        ("3g.71gb", 4, 2), ("4g.71gb", 4, 1), ("7g.141gb", 8, 1))),
)

_BY_NAME = {m.name: m for m in MIG_MODELS}


def all_profiles() -> tuple[MigProfile, ...]:
    """Every profile of the table once (without the `+me` ones), in table order."""
    seen: dict[MigProfile, None] = {}
    for model in MIG_MODELS:
        for row in model.profiles:
            if not row.profile.extra:
                seen.setdefault(row.profile)
    return tuple(seen)


def mig_model(card_model: str) -> MigModel | None:
    """The table's model for a card model as a node or NVML names it (`A100-SXM4-40GB`,
    `NVIDIA A100-PCIE-80GB`, `NVIDIA H100 80GB HBM3`, `H200`, ...); None for a card the table
    does not know (no substitution is made on it)."""
    if card_model in _BY_NAME:
        return _BY_NAME[card_model]
    text = card_model.upper().replace("_", "-").replace(" ", "-")
    if "A30" in text:
        return _BY_NAME["A30-24GB"]
    if "A100" in text:
        return _BY_NAME["A100-80GB" if "80GB" in text else "A100-SXM4-40GB"]
    if "H200" in text:
        return _BY_NAME["H200-141GB"]
    if "H100" in text and "80GB" in text:
        return _BY_NAME["H100-80GB"]
    return None


def compatible(requested: MigProfile, offered: MigProfile, model: str) -> bool:
    """Whether a pod asking `requested` may run on an instance of `offered` on a card of
    `model`: the card's family has `requested` (on some model of the family: the pod's name
    means a size there), `offered` is a profile of `model`, it has at least the compute slices
    and the memory asked, and it is another profile. A `+me` request needs the same media
    extensions; a plain request may take a `+me` instance."""
    card = mig_model(model)
    if card is None or requested == offered:
        return False
    have = card.size(offered)
    if have is None:
        return False
    family = [m for m in MIG_MODELS if m.family == card.family]
    if not any(m.size(requested) is not None for m in family):
        return False
    if requested.extra and requested.extra != offered.extra:
        return False
    return offered.slices >= requested.slices and offered.memory_gb >= requested.memory_gb


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


def parse_profiles(names: Iterable[str]) -> frozenset[str]:
    """Profile names as the configuration writes them, checked (`ResourceError` names the bad
    one); `nvidia.com/mig-` prefixes are dropped."""
    out: set[str] = set()
    for name in names:
        out.add(MigProfile.parse(name).name)
    return frozenset(out)


# --- the rule a move is recorded in ------------------------------------------------------------


@dataclass(frozen=True)
class SubstitutionRule:
    """A MIGSubstitution (elasticgpu.io): pods it selects that ask `from_profile` get
    `to_profile` instead, at admission. It selects the pods of one owner (`owner_uid`: the
    ReplicaSet, Job or StatefulSet whose replacements are rewritten) or one bare pod by name,
    in its own namespace."""

    name: str
    namespace: str
    from_profile: MigProfile
    to_profile: MigProfile
    owner_uid: str | None = None
    pod_name: str | None = None
    reason: str = ""
    #: a bare pod's manifest as it was before the move (`saved_pod`): what the controller
    #: re-creates it from, also after a restart between deleting and re-creating it
    saved_pod: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    #: the pods go back to `from_profile` (`MIG_RETURNING` set): the rule rewrites nothing
    returning: bool = False
    #: what the adapter recorded before its delete: the uid of the pod it deleted, and for a
    #: bare pod `saved_pod_digest(saved_pod)` (`check_rule`, `check_live_pod`)
    moved_pod_uid: str | None = None
    saved_pod_digest: str | None = None
    #: the rule carries the adapter's `MANAGED_BY` label (only such rules are carried out)
    written_by_adapter: bool = False

    def selects(self, pod_namespace: str, pod_name: str, owner_uids: Iterable[str]) -> bool:
        if pod_namespace != self.namespace or self.returning:
            return False
        if self.owner_uid is not None:
            return self.owner_uid in set(owner_uids)
        return self.pod_name is not None and self.pod_name == pod_name


#: What a re-created pod does not inherit: what the API server sets on every object, and where
#: the old pod ran (the new one is scheduled again, to the substitute's node).
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink")


def saved_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A bare pod's manifest as the rule keeps it (`spec.savedPod`): everything the user wrote
    (name, labels, annotations, spec), without what the API server set (uid, resourceVersion,
    timestamps, managedFields, status) and without `spec.nodeName` (the pod is placed again).
    The scheduler's annotations are dropped by `recreated_pod`, which knows their names."""
    out = {k: copy.deepcopy(v) for k, v in pod.items() if k != "status"}
    raw_meta, raw_spec = out.get("metadata"), out.get("spec")
    meta = dict(raw_meta) if isinstance(raw_meta, Mapping) else {}
    for key in _SERVER_METADATA:
        meta.pop(key, None)
    out["metadata"] = meta
    out.setdefault("apiVersion", "v1")
    out.setdefault("kind", "Pod")
    spec = dict(raw_spec) if isinstance(raw_spec, Mapping) else {}
    spec.pop("nodeName", None)
    out["spec"] = spec
    return out


def recreated_pod(rule: SubstitutionRule, scheduler_annotations: Iterable[str] = ()
                  ) -> dict[str, Any]:
    """The bare pod the controller creates for a rule from its `saved_pod`: same name,
    labels, annotations and spec, minus the annotations the scheduler wrote for the old
    placement (`scheduler_annotations`); the profile is rewritten by the webhook at creation
    (and `MIG_ORIGINAL` recorded there), so the manifest is the saved one. Raises ValueError
    for a rule without a saved pod (an owner's rule: the owner re-creates its pods)."""
    if rule.saved_pod is None or rule.pod_name is None:
        raise ValueError(f"MIGSubstitution {rule.namespace}/{rule.name} has no saved pod")
    pod = saved_pod(rule.saved_pod)
    meta = pod["metadata"]
    meta["name"] = rule.pod_name
    meta["namespace"] = rule.namespace
    meta.pop("generateName", None)
    drop = set(scheduler_annotations)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in drop}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return pod


# --- whose rules are carried out, and verified --------------------------------------------------
#
# A bare pod's rule makes the controller create a pod, under its own identity, from the rule's
# `savedPod`; an owner's rule makes the webhook rewrite the owner's pods. So a rule is carried
# out only if the adapter wrote it (its `MANAGED_BY` label; the admission policy lets only the
# system create or change MIGSubstitutions, so no tenant can forge one), and a bare pod's rule
# only with what the adapter recorded before its delete: the deleted pod's uid, and a digest of
# the saved manifest, which the re-created pod must match (an edited or restored rule, or one
# an admin wrote by hand, never turns into a pod). Before it deletes a live pod for a rule, the
# adapter also checks that pod is the one it saved (uid, and spec but for the MIG names).


class RuleProblem(enum.Enum):
    """Why a rule is not carried out: the `reason` of its `Valid=False` condition and Event."""

    #: no `MANAGED_BY: ADAPTER` label: someone else wrote it; ignored
    NOT_WRITTEN_BY_ADAPTER = "NotWrittenByAdapter"
    #: a field the rule cannot be read or carried out with (savedPod missing or malformed)
    INVALID_SPEC = "InvalidSpec"
    #: the record of the move is missing or does not match the saved manifest
    UNVERIFIED = "SavedPodUnverified"
    #: the live pod the rule names is not the pod the adapter saved
    POD_MISMATCH = "PodMismatch"


@dataclass(frozen=True)
class RuleRefusal:
    problem: RuleProblem
    message: str


#: The condition a refused rule carries in its status.
VALID_CONDITION = "Valid"


def saved_pod_digest(saved: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the saved manifest in canonical JSON (sorted keys, no spaces): what
    the adapter records beside `savedPod` and checks before creating a pod from it."""
    text = json.dumps(saved, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _mig_names(container: Mapping[str, Any]) -> set[str]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return set()
    return {str(name) for part in ("limits", "requests")
            if isinstance(resources.get(part), Mapping)
            for name in resources[part]}


def _saved_pod_problem(rule: SubstitutionRule) -> RuleRefusal | None:
    where = f"MIGSubstitution {rule.namespace}/{rule.name}: spec.savedPod"
    saved = rule.saved_pod
    if saved is None:
        return RuleRefusal(RuleProblem.INVALID_SPEC, f"{where} is missing: a podName rule "
                           "re-creates its pod from the manifest saved before the delete")
    for part in ("metadata", "spec"):
        if not isinstance(saved.get(part), Mapping):
            return RuleRefusal(RuleProblem.INVALID_SPEC, f"{where}.{part}="
                               f"{_short(saved.get(part))} is not an object")
    meta, spec = saved["metadata"], saved["spec"]
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers or \
            not all(isinstance(c, Mapping) for c in containers):
        return RuleRefusal(RuleProblem.INVALID_SPEC, f"{where}.spec.containers="
                           f"{_short(containers)} is not a list of containers")
    if meta.get("name") != rule.pod_name:
        return RuleRefusal(RuleProblem.INVALID_SPEC, f"{where}.metadata.name="
                           f"{_short(meta.get('name'))} is not the rule's podName "
                           f"{rule.pod_name!r}")
    if meta.get("namespace") not in (None, rule.namespace):
        return RuleRefusal(RuleProblem.INVALID_SPEC, f"{where}.metadata.namespace="
                           f"{_short(meta.get('namespace'))} is not the rule's namespace")
    wanted = f"nvidia.com/mig-{rule.from_profile.name}"
    if not any(wanted in _mig_names(c) for c in containers):
        return RuleRefusal(RuleProblem.INVALID_SPEC, f"{where} asks no {wanted}: it is not a "
                           f"pod the rule moves from {rule.from_profile.name}")
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_rule(rule: SubstitutionRule) -> RuleRefusal | None:
    """Why the adapter must not carry `rule` out (None: it may). Not its own (no `MANAGED_BY`
    label): ignored, whatever it says. A bare pod's rule also needs a saved manifest that is a
    pod of that name asking `from_profile`, the uid of the pod deleted, and the digest of the
    manifest recorded at the move, matching it."""
    where = f"MIGSubstitution {rule.namespace}/{rule.name}"
    if not rule.written_by_adapter:
        return RuleRefusal(RuleProblem.NOT_WRITTEN_BY_ADAPTER,
                           f"{where} has no label {MANAGED_BY}={ADAPTER}: the MIG adapter "
                           "carries out only the rules it wrote itself (it re-creates only "
                           "pods it deleted); ignored")
    if rule.pod_name is None:
        return None
    problem = _saved_pod_problem(rule)
    if problem is not None:
        return problem
    if not rule.moved_pod_uid:
        return RuleRefusal(RuleProblem.UNVERIFIED, f"{where}: spec.movedPodUID is missing: "
                           "the adapter records the uid of the pod it deletes")
    digest = saved_pod_digest(rule.saved_pod or {})
    if rule.saved_pod_digest != digest:
        return RuleRefusal(RuleProblem.UNVERIFIED,
                           f"{where}: spec.savedPodDigest={_short(rule.saved_pod_digest)} is "
                           f"not the digest of spec.savedPod ({digest}): not the manifest the "
                           "adapter saved")
    return None


def _comparable_spec(spec: Mapping[str, Any], rule: SubstitutionRule) -> dict[str, Any]:
    """A pod spec with the rule's target MIG name read as its source (a rewritten pod asks
    `to_profile` where the saved one asks `from_profile`) and without `nodeName`."""
    out = copy.deepcopy(dict(spec))
    out.pop("nodeName", None)
    src, dst = f"nvidia.com/mig-{rule.from_profile.name}", f"nvidia.com/mig-{rule.to_profile.name}"
    for kind in ("containers", "initContainers"):
        for container in out.get(kind) or []:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            for part in ("limits", "requests"):
                names = resources.get(part)
                if isinstance(names, dict) and dst in names:
                    resources[part] = {src if k == dst else k: v for k, v in names.items()}
    return out


def check_live_pod(rule: SubstitutionRule, pod: Mapping[str, Any]) -> RuleRefusal | None:
    """Before the adapter deletes a live pod for a bare pod's rule, to create it again from
    the rule (`check_rule` has passed): the pod must have exactly the saved spec but for the
    MIG names. It is then the pod the adapter saved (`moved_pod_uid`: a move that stopped
    before its delete) or the one it created from the rule (which came back un-rewritten);
    either way the pod created instead is the same pod. A rule naming someone else's pod with
    a manifest of its own never gets that pod deleted and replaced."""
    where = f"MIGSubstitution {rule.namespace}/{rule.name}"
    live = pod.get("spec")
    saved = (rule.saved_pod or {}).get("spec")
    if not isinstance(live, Mapping) or not isinstance(saved, Mapping):
        return RuleRefusal(RuleProblem.POD_MISMATCH, f"{where}: no spec to compare")
    a, b = _comparable_spec(saved, rule), _comparable_spec(live, rule)
    differs = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if differs:
        return RuleRefusal(RuleProblem.POD_MISMATCH,
                           f"{where}: spec.savedPod differs from the live pod "
                           f"{rule.namespace}/{rule.pod_name} in spec.{', spec.'.join(differs)}"
                           ": the adapter re-creates a pod only with exactly its own spec; it "
                           "is left alone")
    return None


# --- what the controller reads and does with its rules -----------------------------------------


@dataclass(frozen=True)
class BoundPod:
    """A pod placed on a node that may hold MIG instances: the instance uuids its assignment
    names (the extender's ledger), and the MIG profiles it asks that no assignment names (a
    pod placed without the extender: it holds *an* instance of each on its node)."""

    node: str
    mig_uuids: tuple[str, ...] = ()
    unassigned: tuple[MigProfile, ...] = ()


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


def parse_original(annotation: str) -> dict[str, MigProfile]:
    """`MIG_ORIGINAL` (`<container>=<profile>,...`) read back; unreadable pairs are left out."""
    out: dict[str, MigProfile] = {}
    for pair in annotation.split(","):
        container, _, profile = pair.partition("=")
        try:
            out[container.strip()] = MigProfile.parse(profile.strip())
        except ValueError:
            continue
    return out


def rule_name(subject: str, from_profile: MigProfile, to_profile: MigProfile, key: str) -> str:
    """A MIGSubstitution's name: readable (`<subject>-<from>-to-<to>`, dots and `+` dropped)
    and unique per (`key`: the owner's uid or the bare pod's name, from, to), a DNS name of at
    most 63 characters."""
    import hashlib

    digest = hashlib.sha256(f"{key}/{from_profile.name}/{to_profile.name}".encode()).hexdigest()
    readable = f"{subject}-{from_profile.name}-to-{to_profile.name}"
    readable = "".join(c if c.isalnum() or c == "-" else "" for c in readable.lower())
    return f"{readable[:50].strip('-')}-{digest[:8]}"


class BareStep(enum.Enum):
    """The next step of a bare pod's rule (`bare_rule_step`)."""

    #: nothing to do: the pod runs under the rule (or waits)
    NONE = "none"
    #: create the pod from the rule's saved manifest (it was deleted; maybe by a controller
    #: that crashed before it could re-create it)
    CREATE = "create"
    #: delete the pod (a move or a return that stopped before its delete)
    DELETE_POD = "delete-pod"
    #: delete the rule: nothing refers to it any more
    DELETE_RULE = "delete-rule"
    #: wait: the pod is being deleted (this controller's delete, held by a finalizer such as
    #: the budget keeper's); the step after it is gone is CREATE
    WAIT = "wait"


@dataclass(frozen=True)
class BarePodState:
    """What the API shows of a bare pod's rule and its pod."""

    exists: bool
    #: the pod carries the rule's rewrite (`MIG_SUBSTITUTION` names the rule)
    rewritten: bool = False
    #: waiting to be scheduled (no node, marked unschedulable)
    pending: bool = False
    #: it has ended (Succeeded / Failed): a finished pod is not re-created
    finished: bool = False
    #: the rule's status names the pod it re-created (the move finished once)
    recorded: bool = False
    #: it has a deletionTimestamp (a finalizer may hold it for a while)
    terminating: bool = False


def bare_rule_step(rule: SubstitutionRule, pod: BarePodState) -> BareStep:
    """What makes a bare pod's rule true again, from what the API shows alone (no memory of
    what this process did: a controller SIGKILLed at any point finishes after a restart).

    A move is: create the rule with the saved pod, delete the pod, create it from the rule
    (rewritten at admission), record it in the rule's status. A return is: mark the rule
    returning, delete the pod, create it (as written), delete the rule. So a missing pod is
    created, unless the move had finished (`recorded`: then someone else deleted the moved pod,
    and the rule refers to nothing); a moving rule whose pod is still un-rewritten and pending
    stopped before its delete; a returning rule whose pod is still rewritten stopped before
    its delete; a returning rule whose pod runs as written, a moving one whose pod got placed
    on its own profile meanwhile, and one whose pod finished refer to nothing. A pod being
    deleted is waited for, finished or not: until it is gone its name cannot be re-created,
    and judging it as if it stayed would delete the rule holding its saved manifest (the pod
    would be lost). Finished does not tell here: kube-controller-manager's pod GC marks a
    deleted pod that was never scheduled `Failed` while a finalizer (the budget keeper's)
    holds it. Once it is gone, the rules above for a missing pod decide."""
    if pod.exists and pod.terminating:
        return BareStep.WAIT
    if not pod.exists:
        return BareStep.CREATE if rule.returning or not pod.recorded else BareStep.DELETE_RULE
    if rule.returning:
        return BareStep.DELETE_POD if pod.rewritten and not pod.finished else BareStep.DELETE_RULE
    if pod.rewritten:
        return BareStep.DELETE_RULE if pod.finished else BareStep.NONE
    if pod.pending and not pod.recorded:
        return BareStep.DELETE_POD
    return BareStep.DELETE_RULE


def owner_rule_unused(referring_pods: int, in_flight: bool, age_s: float, grace_s: float
                      ) -> bool:
    """Whether an owner's rule may be deleted: no pod refers to it (`MIG_SUBSTITUTION` names
    it on an unfinished pod), no move under it is in flight, and it is older than `grace_s`
    (its owner's replacement may not have been created yet)."""
    return referring_pods == 0 and not in_flight and age_s >= grace_s


# --- the dry-run re-carve advisor (optional, behind `mig.recarveAdvice`) ------------------------


@dataclass(frozen=True)
class Recarve:
    """A layout change that would let a pod run: on `card`, destroy the free instances
    `destroy` and create `create`; `layout` is the card's layout after it. Advice only: the
    adapter never changes a MIG layout."""

    node: str
    card: str
    model: str
    destroy: tuple[MigProfile, ...]
    create: MigProfile
    layout: tuple[MigProfile, ...]

    @property
    def message(self) -> str:
        gone = ", ".join(p.name for p in self.destroy) or "nothing"
        return (f"dry run: card {self.card} on node {self.node} ({self.model}) could hold a "
                f"{self.create.name} if re-carved (destroy free {gone}; layout "
                f"{' + '.join(p.name for p in self.layout)}); no layout is changed")


def layout_fits(model: MigModel, layout: Sequence[MigProfile]) -> bool:
    """Whether one card of `model` can carry these instances together by NVIDIA's slice
    counts: every profile the model's, the compute and memory slices within the card's, no
    profile more often than its instances per card (a necessary condition; the driver's
    placement rules pick the exact positions)."""
    sizes = [model.size(p) for p in layout]
    if any(s is None for s in sizes):
        return False
    known = [s for s in sizes if s is not None]
    if sum(s.compute_slices for s in known) > model.compute_slices or \
            sum(s.memory_slices for s in known) > model.memory_slices:
        return False
    return all(sum(1 for k in known if k.profile == s.profile) <= s.max_instances
               for s in known)


def recarve_advice(requested: MigProfile, nodes: Iterable[Node], held: Iterable[str],
                   constraints: Constraints = Constraints()) -> Recarve | None:
    """The re-carve that would give a pod asking `requested` an instance where it may run,
    destroying the fewest free instances (held ones are never touched): on each
    healthy card of a model it may use, the profile to create is `requested` if the model has
    it, else the smallest profile compatible with it; the free instances destroyed are the
    fewest (then the fewest compute slices) after which the layout fits (`layout_fits`).
    None when no card can. Ties: node, then card."""
    import itertools

    taken = set(held)
    best: tuple[tuple[int, int, str, str], Recarve] | None = None
    for node in nodes:
        if constraints.nodes is not None and node.name not in constraints.nodes:
            continue
        for card in node.cards:
            model = mig_model(card.model)
            if model is None or not card.healthy or card.model in constraints.denied_models or \
                    (constraints.models is not None and card.model not in constraints.models):
                continue
            if model.size(requested) is not None:
                create = requested
            else:
                options = sorted((r.profile for r in model.profiles
                                  if compatible(requested, r.profile, card.model)),
                                 key=lambda p: (p.slices, p.memory_gb, bool(p.extra)))
                if not options:
                    continue
                create = options[0]
            kept = [i.profile for i in card.mig if i.uuid in taken or i.health is not Health.HEALTHY]
            free = [i.profile for i in card.mig if i.uuid not in taken
                    and i.health is Health.HEALTHY]
            for count in range(len(free) + 1):
                found = None
                for gone in itertools.combinations(range(len(free)), count):
                    rest = [p for k, p in enumerate(free) if k not in gone]
                    layout = [*kept, *rest, create]
                    if layout_fits(model, layout):
                        cost = sum(free[k].slices for k in gone)
                        if found is None or cost < found[0]:
                            found = (cost, tuple(free[k] for k in gone), tuple(layout))
                if found is not None:
                    key = (count, found[0], node.name, card.uuid)
                    advice = Recarve(node.name, card.uuid, card.model, found[1], create, found[2])
                    if best is None or key < best[0]:
                        best = (key, advice)
                    break
    return best[1] if best is not None else None
