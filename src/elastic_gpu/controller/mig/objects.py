"""What the MIG adapter reads off a pod or a rule, and the objects' apiVersion/kind for Events.

Pure functions of one object (or of a pod and the Nodes), shared by every step of a round.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_gpu.api import migsubstitution as rules_api
from elastic_gpu.api.elasticgpu import GROUP, VERSION
from elastic_gpu.core import annotations as ann
from elastic_gpu.core import nodeaffinity
from elastic_gpu.core.mig.rules import MIG_SUBSTITUTION, SubstitutionRule
from elastic_gpu.core.mig.substitution import mig_request
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.informer import Obj

RULE_API_VERSION = f"{GROUP}/{VERSION}"
#: the scheduler's annotations a re-created pod must not inherit (a new placement comes)
SCHEDULER_ANNOTATIONS = (ann.ASSIGNMENT, ann.ASSIGNED_NODE, ann.ALLOCATED)
#: the rules a round carries out, by key (namespace/name): the object and its decoding
Rules = Mapping[str, tuple[Obj, SubstitutionRule]]


def now_stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age_s(obj: Mapping[str, Any]) -> float:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return 0.0
    try:
        made = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return 0.0
    return (dt.datetime.now(dt.UTC) - made).total_seconds()


def as_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object with apiVersion and kind (list items come without; Events need them)."""
    return {"apiVersion": "v1", "kind": "Pod", **obj}


def as_rule(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": RULE_API_VERSION, "kind": rules_api.KIND, **obj}


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    notes = metadata_of(obj).get("annotations")
    return notes if isinstance(notes, Mapping) else {}


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Pending, not placed, and kube-scheduler said why (PodScheduled False, Unschedulable)."""
    if (pod.get("spec") or {}).get("nodeName") or metadata_of(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or [] if isinstance(c, Mapping))


def controller_owner(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in metadata_of(pod).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    refs = metadata_of(pod).get("ownerReferences") or []
    return refs[0] if refs and isinstance(refs[0], Mapping) else None


def pod_profile(request: PodRequest) -> MigProfile | None:
    return mig_request(request)


def applied_rules(pod: Mapping[str, Any]) -> list[str]:
    return [r for r in annotations_of(pod).get(MIG_SUBSTITUTION, "").split(",") if r]


def allowed_nodes(pod: Mapping[str, Any], nodes: Iterable[Obj]) -> frozenset[str] | None:
    """The Nodes the pod's affinity, selector and tolerations let it run on."""
    try:
        rules = nodeaffinity.rules_from_manifest(pod)
    except nodeaffinity.RulesError:
        return frozenset()
    allowed = set()
    for node in nodes:
        name = str(metadata_of(node).get("name"))
        labels = metadata_of(node).get("labels") or {}
        if nodeaffinity.refusal(rules, name, labels,
                                nodeaffinity.taints_from_node(node)) is None:
            allowed.add(name)
    return frozenset(allowed)


def holds_mig(egpu: Mapping[str, Any]) -> bool:
    """Whether an ElasticGPU object names a MIG instance (`spec.cards[].migUuid`). Only those
    enter a round (as instances held); a change of any other ElasticGPU changes nothing a
    round reads, so it starts none (a claim's create, provisioning and binding are three)."""
    cards = (egpu.get("spec") or {}).get("cards")
    return isinstance(cards, list) and \
        any(isinstance(c, Mapping) and c.get("migUuid") for c in cards)


def device_round_inputs(device: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a round reads of a GPUDevice: its spec (cards, MIG instances) and its health. Its
    allocation columns and usage samples, rewritten as claims and pods come and go, are not
    read (a change the periodic round still sees: RESYNC_S)."""
    return device.get("spec"), (device.get("status") or {}).get("health")
