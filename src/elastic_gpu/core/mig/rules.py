"""The MIGSubstitution a move is recorded in: the rule, a bare pod's saved manifest, and the
checks that decide whether the adapter may carry a rule out (it re-creates only pods it
deleted, from exactly the manifest it saved).
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.annotations import MANAGED_BY
from elastic_gpu.core.request import lifetime_containers
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
    if not any(wanted in _mig_names(c.container) for c in lifetime_containers(saved)):
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
