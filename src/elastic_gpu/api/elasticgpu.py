"""The Elastic GPU API: ElasticGPUClass, ElasticGPUClaim, ElasticGPU (group elasticgpu.io, v1alpha).

GPUs managed the way storage is: ElasticGPUClass ~ StorageClass, ElasticGPUClaim ~
PersistentVolumeClaim, ElasticGPU ~ PersistentVolume. The wire form is the Elastic GPU seed's
(DESIGN.md 7.1): its users' manifests apply unchanged, e.g.

    apiVersion: elasticgpu.io/v1alpha
    kind: ElasticGPUClass
    metadata: {name: gpushare-egpuclass}
    provisioner: gpushare.provisioner.elasticgpu.io      # top level, like a StorageClass
    reclaimPolicy: Retain                                # Retain | Delete (default Delete)
    egpuBindingMode: Immediate                           # Immediate | WaitForFirstConsumer
    ---
    apiVersion: elasticgpu.io/v1alpha
    kind: ElasticGPUClaim
    metadata: {name: gpushare-egpuc-1}
    spec:
      egpuClassName: gpushare-egpuclass
      resources: {requests: {gpushare.provisioner.elasticgpu.io/gpu-core: 10,
                             gpushare.provisioner.elasticgpu.io/gpu-memory: 4}}

This module is the one source of truth of the three CRDs (`crd_manifests()`; the files in
deploy/crds/ are its YAML form, written by `python -m elastic_gpu.api.elasticgpu --write
deploy/crds` and kept equal by a unit test) and of their typed objects (msgspec structs,
decoded strictly from what the API serves, converted to the pure core types of
`elastic_gpu.core.claims`). No I/O.

Later versions: v1alpha is the only served and stored version (`conversion: None`). A v1beta1
is added as a second served version with `strategy: Webhook` served by `egpu webhook`
(v1alpha stays served for the seed's manifests), then made the storage version, the stored
objects rewritten (a storage-version migration) and v1alpha's `storedVersions` entry dropped;
see docs/claims.md, "Versions".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import msgspec

from elastic_gpu.api.crd import column, conditions_schema, crd, immutable, to_yaml, write_main
from elastic_gpu.api.group import ELASTICGPU_VERSION
from elastic_gpu.api.group import GROUP as GROUP
from elastic_gpu.core.assignment import AssignmentError, CardShare
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.decisions import Decision, claim_outcome
from elastic_gpu.core.claims.model import ClaimPhase, Condition, ElasticGPUPhase, GPUClass
from elastic_gpu.core.resources import MIG_RESOURCE_PATTERN, RESOURCE_TABLE

VERSION = ELASTICGPU_VERSION
API_VERSION = f"{GROUP}/{VERSION}"

CLASS_KIND, CLASS_PLURAL, CLASS_SHORT = "ElasticGPUClass", "elasticgpuclasses", "egpuclass"
CLAIM_KIND, CLAIM_PLURAL, CLAIM_SHORT = "ElasticGPUClaim", "elasticgpuclaims", "egpuc"
EGPU_KIND, EGPU_PLURAL, EGPU_SHORT = "ElasticGPU", "elasticgpus", "egpu"
CRD_FILES = {CLASS_PLURAL: "elasticgpuclasses.yaml", CLAIM_PLURAL: "elasticgpuclaims.yaml",
             EGPU_PLURAL: "elasticgpus.yaml"}

#: A DNS-1123 subdomain (the names of classes and ElasticGPUs).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A provisioner: a DNS subdomain, optionally followed by /<name> (StorageClass's form).
PROVISIONER_PATTERN = (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                       r"(/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
#: How a request value may be written as a string: the digits of a whole number with at most
#: a decimal suffix or exponent (the forms the apiserver itself writes); the resource table's
#: rules (a share is 1-99 %, ...) are checked by the provisioner, whose refusal is a condition.
QUANTITY_STRING = r"^[0-9]+([kMGTPE]|[eE][0-9]+)?$"
MAX_REQUESTS = 8


class ElasticGPUObjectError(ValueError):
    """An object of the Elastic GPU API that cannot be read; the message names object and field."""


# --------------------------------------------------------------------------- CRD schemas


def _name(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN,
            "description": description}


def _known_names_rule() -> str:
    names = ", ".join(f"'{spec.name}'" for spec in RESOURCE_TABLE)
    mig = MIG_RESOURCE_PATTERN.pattern.replace("\\Z", "$").replace("\\", "\\\\")
    return f"self.all(k, k in [{names}] || k.matches('^{mig}'))"


def resource_list_schema(description: str, *, min_properties: int = 0) -> dict[str, Any]:
    """A map of GPU resource name -> whole number (an integer >= 0 or a quantity string), keyed
    by names of the resource table (`core.resources.RESOURCE_TABLE`, MIG profiles included)."""
    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "maxProperties": MAX_REQUESTS,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "maxLength": 64,
            "x-kubernetes-validations": [{
                "rule": f"type(self) == int ? self >= 0 : string(self).matches('{QUANTITY_STRING}')",
                "message": "must be a whole number >= 0 (an integer, or digits with at most a "
                           "suffix k, M, G, T, P, E); no sign, fraction or byte suffix"}],
        },
        "x-kubernetes-validations": [
            {"rule": _known_names_rule(),
             "message": "every key must be a GPU resource name of Elastic GPU's resource table "
                        "(e.g. gpushare.provisioner.elasticgpu.io/gpu-core, "
                        "elasticgpu.io/gpu-memory, nvidia.com/gpu, nvidia.com/mig-1g.10gb)"},
        ],
    }
    if min_properties:
        schema["minProperties"] = min_properties
    return schema


def _card_schema() -> dict[str, Any]:
    """One card share of an ElasticGPU, the assignment's form (`core.assignment.CardShare`)."""
    return {
        "type": "object",
        "required": ["index", "uuid", "milli", "memoryMiB"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "uuid": {"type": "string", "minLength": 1, "maxLength": 128},
            "milli": {"type": "integer", "minimum": 0, "maximum": 1000,
                      "description": "compute held on the card, 1000 = the whole card"},
            "memoryMiB": {"type": "integer", "minimum": 0},
            "mig": {"type": "string", "maxLength": 64,
                    "description": "MIG profile of the instance held"},
            "migUuid": {"type": "string", "maxLength": 128},
            "replicas": {"type": "integer", "minimum": 0, "maximum": 64},
        },
    }


def _crd_of(kind: str, plural: str, short: str, scope: str, schema: dict[str, Any],
            columns: list[dict[str, Any]], status: bool) -> dict[str, Any]:
    return crd(kind, plural, short, scope, schema, columns, status, VERSION)


def class_crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": "How ElasticGPUs are provisioned for claims that name this class "
                       "(like a StorageClass).",
        "required": ["provisioner"],
        "x-kubernetes-validations": [{
            "rule": "has(self.parameters) == has(oldSelf.parameters)",
            "message": "parameters is immutable (it cannot be added or removed either)"}],
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "provisioner": {
                "type": "string", "minLength": 1, "maxLength": 253, "pattern": PROVISIONER_PATTERN,
                "description": "The provisioner plug-in: gpushare.provisioner.elasticgpu.io (a "
                               "fractional share of one card), gpu.provisioner.elasticgpu.io "
                               "(whole cards), mig.provisioner.elasticgpu.io (MIG instances)",
                "x-kubernetes-validations": immutable("provisioner")},
            "parameters": {
                "type": "object", "maxProperties": 32,
                "additionalProperties": {"type": "string", "maxLength": 1024},
                "description": "Provisioner parameters: models (A100|H100), denyModels, "
                               "nodePolicy, cardPolicy",
                "x-kubernetes-validations": immutable("parameters")},
            "reclaimPolicy": {
                "type": "string", "enum": [p.value for p in claim_model.ReclaimPolicy],
                "default": claim_model.ReclaimPolicy.DELETE.value,
                "description": "What happens to an ElasticGPU when its claim is deleted: Delete "
                               "frees its cards, Retain keeps it Released, holding them",
                "x-kubernetes-validations": immutable("reclaimPolicy")},
            "egpuBindingMode": {
                "type": "string", "enum": [m.value for m in claim_model.BindingMode],
                "default": claim_model.BindingMode.IMMEDIATE.value,
                "description": "Immediate: provision when the claim is created; "
                               "WaitForFirstConsumer: when the first pod naming it is placed",
                "x-kubernetes-validations": immutable("egpuBindingMode")},
        },
    }
    columns = [
        column("Provisioner", "string", ".provisioner", "Provisioner plug-in"),
        column("ReclaimPolicy", "string", ".reclaimPolicy", "Retain or Delete"),
        column("BindingMode", "string", ".egpuBindingMode", "Immediate or WaitForFirstConsumer"),
        column("Age", "date", ".metadata.creationTimestamp", "Age"),
    ]
    return _crd_of(CLASS_KIND, CLASS_PLURAL, CLASS_SHORT, "Cluster", schema, columns, status=False)


def claim_crd() -> dict[str, Any]:
    spec = {
        "type": "object",
        "required": ["resources"],
        "properties": {
            "egpuClassName": {**_name("The ElasticGPUClass to provision from"),
                              "x-kubernetes-validations": immutable("spec.egpuClassName")},
            "resources": {
                "type": "object", "required": ["requests"],
                "properties": {"requests": resource_list_schema(
                    "GPU resources the claim asks for, in any name of the resource table",
                    min_properties=1)},
                "x-kubernetes-validations": [{
                    "rule": "self == oldSelf",
                    "message": "spec.resources is immutable: delete the claim and create a new one"}],
            },
            "elasticGPUName": _name("Static binding: the pre-created ElasticGPU to bind to (set "
                                    "by the controller when it binds a provisioned one)"),
        },
        "x-kubernetes-validations": [
            {"rule": "has(self.egpuClassName) || has(self.elasticGPUName)",
             "message": "spec.egpuClassName is required (the ElasticGPUClass to provision from), "
                        "unless spec.elasticGPUName names a pre-created ElasticGPU"},
            {"rule": "!has(oldSelf.elasticGPUName) || (has(self.elasticGPUName) && "
                     "self.elasticGPUName == oldSelf.elasticGPUName)",
             "message": "spec.elasticGPUName cannot be changed or removed once set"},
            {"rule": "has(self.egpuClassName) == has(oldSelf.egpuClassName)",
             "message": "spec.egpuClassName cannot be added or removed"},
        ],
    }
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": [p.value for p in ClaimPhase]},
            "elasticGPUName": {"type": "string", "description": "The ElasticGPU bound"},
            "node": {"type": "string", "description": "Node of the bound ElasticGPU"},
            "capacity": resource_list_schema("What the bound ElasticGPU holds"),
            "conditions": conditions_schema(),
        },
    }
    schema = {
        "type": "object",
        "description": "A user's request for an ElasticGPU (like a PersistentVolumeClaim); pods "
                       "use it with the annotation egpuc.elasticgpu.io/<container>: <claim>.",
        "required": ["spec"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "metadata": {"type": "object"}, "spec": spec, "status": status},
    }
    columns = [
        column("Status", "string", ".status.phase", "Pending, Bound or Lost"),
        column("ElasticGPU", "string", ".status.elasticGPUName", "The ElasticGPU bound"),
        column("Capacity", "string", ".status.capacity", "What the bound ElasticGPU holds"),
        column("Class", "string", ".spec.egpuClassName", "ElasticGPUClass"),
        column("Node", "string", ".status.node", "Node of the bound ElasticGPU"),
        column("Requests", "string", ".spec.resources.requests", "What the claim asks", 1),
        column("Age", "date", ".metadata.creationTimestamp", "Age"),
    ]
    return _crd_of(CLAIM_KIND, CLAIM_PLURAL, CLAIM_SHORT, "Namespaced", schema, columns, status=True)


def elasticgpu_crd() -> dict[str, Any]:
    claim_ref = {
        "type": "object",
        "required": ["namespace", "name"],
        "description": "The claim bound (or pre-bound) to this ElasticGPU",
        "properties": {"namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                       "name": {"type": "string", "minLength": 1, "maxLength": 253},
                       "uid": {"type": "string", "maxLength": 64}},
        "x-kubernetes-validations": [{
            # `namespace` is a CEL reserved word: the apiserver escapes the field as __namespace__
            "rule": "self.__namespace__ == oldSelf.__namespace__ && self.name == oldSelf.name",
            "message": "spec.claimRef cannot be changed to another claim (remove it first)"}],
    }
    spec = {
        "type": "object",
        "required": ["capacity", "node", "cards"],
        "properties": {
            "capacity": resource_list_schema("What this ElasticGPU holds (resource table names)",
                                             min_properties=1),
            "node": {"type": "string", "minLength": 1, "maxLength": 253,
                     "description": "Node of the cards",
                     "x-kubernetes-validations": immutable("spec.node")},
            "cards": {"type": "array", "minItems": 1, "maxItems": 64, "items": _card_schema(),
                      "description": "The card shares held, in the pod assignment's form",
                      "x-kubernetes-validations": immutable("spec.cards")},
            "claimRef": claim_ref,
            "egpuClassName": {"type": "string", "maxLength": 253,
                              "description": "Class it was provisioned by"},
            "reclaimPolicy": {"type": "string", "enum": [p.value for p in claim_model.ReclaimPolicy],
                              "default": claim_model.ReclaimPolicy.RETAIN.value,
                              "description": "Delete or Retain when its claim is deleted "
                                             "(a pre-created ElasticGPU defaults to Retain)"},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": [p.value for p in ElasticGPUPhase]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "conditions": conditions_schema(),
        },
    }
    schema = {
        "type": "object",
        "description": "One provisioned GPU resource (a share of a card, whole cards, MIG "
                       "instances) on one node (like a PersistentVolume).",
        "required": ["spec"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "metadata": {"type": "object"}, "spec": spec, "status": status},
    }
    columns = [
        column("Capacity", "string", ".spec.capacity", "What it holds"),
        column("Node", "string", ".spec.node", "Node of the cards"),
        column("Cards", "string", ".spec.cards[*].index", "Card indexes on the node"),
        column("ReclaimPolicy", "string", ".spec.reclaimPolicy", "Delete or Retain"),
        column("Status", "string", ".status.phase",
                "Pending, Available, Bound, Released or Failed"),
        column("Claim", "string", ".spec.claimRef.name", "Claim bound"),
        column("Reason", "string", ".status.reason", "Why Failed or Released", 1),
        column("ClaimNamespace", "string", ".spec.claimRef.namespace", "Its namespace", 1),
        column("Class", "string", ".spec.egpuClassName", "ElasticGPUClass"),
        column("Age", "date", ".metadata.creationTimestamp", "Age"),
    ]
    return _crd_of(EGPU_KIND, EGPU_PLURAL, EGPU_SHORT, "Cluster", schema, columns, status=True)


def crd_manifests() -> dict[str, dict[str, Any]]:
    """plural -> CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    return {CLASS_PLURAL: class_crd(), CLAIM_PLURAL: claim_crd(), EGPU_PLURAL: elasticgpu_crd()}


def crd_yaml(plural: str) -> str:
    kind = crd_manifests()[plural]["spec"]["names"]["kind"]
    header = (f"# {kind} (elasticgpu.io/{VERSION}): see docs/claims.md.\n"
              "# Generated by `python -m elastic_gpu.api.elasticgpu --write deploy/crds` from\n"
              "# elastic_gpu.api.elasticgpu.crd_manifests() (a unit test keeps them equal).\n")
    body = to_yaml(crd_manifests()[plural])
    return header + body


# --------------------------------------------------------------------------- typed objects

Quantity = int | str
T = TypeVar("T")
E = TypeVar("E", claim_model.ReclaimPolicy, claim_model.BindingMode, ClaimPhase, ElasticGPUPhase)


class ObjectMeta(msgspec.Struct, rename="camel"):
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    deletion_timestamp: str | None = None
    finalizers: list[str] = msgspec.field(default_factory=list)


class ElasticGPUClass(msgspec.Struct, rename="camel"):
    metadata: ObjectMeta
    provisioner: str
    parameters: dict[str, str] = msgspec.field(default_factory=dict)
    reclaim_policy: str = claim_model.ReclaimPolicy.DELETE.value
    egpu_binding_mode: str = claim_model.BindingMode.IMMEDIATE.value


class ClaimResources(msgspec.Struct):
    requests: dict[str, Quantity]


class ClaimSpec(msgspec.Struct, rename="camel"):
    resources: ClaimResources
    egpu_class_name: str | None = None
    elastic_gpu_name: str | None = msgspec.field(default=None, name="elasticGPUName")


class ClaimStatus(msgspec.Struct, rename="camel"):
    phase: str | None = None
    elastic_gpu_name: str | None = msgspec.field(default=None, name="elasticGPUName")
    node: str | None = None


class ElasticGPUClaim(msgspec.Struct, rename="camel"):
    metadata: ObjectMeta
    spec: ClaimSpec
    status: ClaimStatus = msgspec.field(default_factory=ClaimStatus)


class ClaimRef(msgspec.Struct):
    namespace: str
    name: str
    uid: str = ""


class CardEntry(msgspec.Struct, rename="camel"):
    index: int
    uuid: str
    milli: int
    memory_mi_b: int = msgspec.field(name="memoryMiB")
    mig: str | None = None
    mig_uuid: str | None = None
    replicas: int = 0


class ElasticGPUSpec(msgspec.Struct, rename="camel"):
    capacity: dict[str, Quantity]
    node: str
    cards: list[CardEntry]
    claim_ref: ClaimRef | None = None
    egpu_class_name: str | None = None
    reclaim_policy: str = claim_model.ReclaimPolicy.RETAIN.value


class ElasticGPUStatus(msgspec.Struct, rename="camel"):
    phase: str | None = None
    reason: str = ""
    message: str = ""


class ElasticGPU(msgspec.Struct, rename="camel"):
    metadata: ObjectMeta
    spec: ElasticGPUSpec
    status: ElasticGPUStatus = msgspec.field(default_factory=ElasticGPUStatus)


def _decode(obj: Mapping[str, Any], kind: type[T]) -> T:
    name = (obj.get("metadata") or {}).get("name", "?") if isinstance(obj, Mapping) else "?"
    try:
        return msgspec.convert(obj, kind, strict=True)
    except msgspec.ValidationError as err:
        raise ElasticGPUObjectError(f"{kind.__name__} {name}: {err}") from None


def _enum(
        kind: type[E], value: str | None, where: str, default: E | None = None) -> E | None:
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        allowed = " | ".join(m.value for m in kind)
        raise ElasticGPUObjectError(f"{where}={value!r} is not one of {allowed}") from None


def class_from_object(obj: Mapping[str, Any]) -> GPUClass:
    raw = _decode(obj, ElasticGPUClass)
    where = f"ElasticGPUClass {raw.metadata.name}"
    reclaim = _enum(claim_model.ReclaimPolicy, raw.reclaim_policy, f"{where}: reclaimPolicy")
    mode = _enum(claim_model.BindingMode, raw.egpu_binding_mode, f"{where}: egpuBindingMode")
    assert reclaim is not None and mode is not None
    return GPUClass(raw.metadata.name, raw.provisioner, dict(raw.parameters), reclaim, mode)


def claim_from_object(obj: Mapping[str, Any]) -> claim_model.Claim:
    raw = _decode(obj, ElasticGPUClaim)
    where = f"ElasticGPUClaim {raw.metadata.namespace}/{raw.metadata.name}"
    phase = _enum(ClaimPhase, raw.status.phase, f"{where}: status.phase", ClaimPhase.PENDING)
    assert phase is not None
    return claim_model.Claim(namespace=raw.metadata.namespace, name=raw.metadata.name, uid=raw.metadata.uid,
                      class_name=raw.spec.egpu_class_name, requests=dict(raw.spec.resources.requests),
                      elastic_gpu_name=raw.spec.elastic_gpu_name, phase=phase,
                      deleting=raw.metadata.deletion_timestamp is not None)


def elasticgpu_from_object(obj: Mapping[str, Any]) -> claim_model.ElasticGPU:
    raw = _decode(obj, ElasticGPU)
    where = f"ElasticGPU {raw.metadata.name}"
    # no status yet: not looked at (a pre-created one becomes Available once checked)
    phase = _enum(ElasticGPUPhase, raw.status.phase, f"{where}: status.phase",
                  ElasticGPUPhase.PENDING)
    reclaim = _enum(claim_model.ReclaimPolicy, raw.spec.reclaim_policy, f"{where}: spec.reclaimPolicy")
    assert phase is not None and reclaim is not None
    try:
        shares = tuple(CardShare.from_dict(msgspec.to_builtins(card)) for card in raw.spec.cards)
    except AssignmentError as err:
        raise ElasticGPUObjectError(f"{where}: spec.cards: {err}") from None
    ref = raw.spec.claim_ref
    return claim_model.ElasticGPU(
        name=raw.metadata.name, capacity=dict(raw.spec.capacity), node=raw.spec.node,
        shares=shares, claim_ref=claim_model.ClaimRef(ref.namespace, ref.name, ref.uid) if ref else None,
        class_name=raw.spec.egpu_class_name, reclaim_policy=reclaim, phase=phase)


def elasticgpu_to_object(egpu: claim_model.ElasticGPU) -> dict[str, Any]:
    """The full object of an ElasticGPU (status included, for a first create; the status
    subresource ignores it on create, so the controller writes it with a second call)."""
    spec: dict[str, Any] = {
        "capacity": dict(egpu.capacity), "node": egpu.node,
        "cards": [share.to_dict() for share in egpu.shares],
        "reclaimPolicy": egpu.reclaim_policy.value,
    }
    if egpu.claim_ref is not None:
        spec["claimRef"] = {"namespace": egpu.claim_ref.namespace, "name": egpu.claim_ref.name,
                            "uid": egpu.claim_ref.uid}
    if egpu.class_name is not None:
        spec["egpuClassName"] = egpu.class_name
    return {"apiVersion": API_VERSION, "kind": EGPU_KIND, "metadata": {"name": egpu.name},
            "spec": spec, "status": {"phase": egpu.phase.value}}


def merge_condition(existing: Sequence[Mapping[str, Any]], new: Condition, now: str,
                    generation: int = 0) -> list[dict[str, Any]]:
    """`existing` conditions with `new` set (metav1.Condition semantics): lastTransitionTime
    changes only when the status does, so a claim re-reconciled with the same outcome keeps
    the time it became so (and an unchanged status patch is a no-op)."""
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in existing:
        if cond.get("type") != new.type:
            out.append(dict(cond))
            continue
        replaced = True
        since = cond.get("lastTransitionTime") if cond.get("status") == new.status else None
        out.append(_condition(new, since or now, generation))
    if not replaced:
        out.append(_condition(new, now, generation))
    return out


def _condition(cond: Condition, since: str, generation: int) -> dict[str, Any]:
    return {"type": cond.type, "status": cond.status, "reason": cond.reason,
            "message": cond.message[:32768], "lastTransitionTime": since,
            "observedGeneration": generation}


def claim_status(decision: Decision, claim_obj: Mapping[str, Any], now: str,
                 egpu: claim_model.ElasticGPU | None = None) -> dict[str, Any]:
    """The claim's status once `decision` is carried out (for a status-subresource patch):
    phase, the bound ElasticGPU (its node and capacity) and the merged Bound condition."""
    status = claim_obj.get("status") or {}
    metadata = claim_obj.get("metadata") or {}
    current = _enum(ClaimPhase, status.get("phase"), "status.phase", ClaimPhase.PENDING)
    assert current is not None
    phase, condition = claim_outcome(decision, current)
    out: dict[str, Any] = {
        "phase": phase.value,
        "conditions": merge_condition(status.get("conditions") or [], condition, now,
                                      int(metadata.get("generation") or 0)),
    }
    if phase is ClaimPhase.BOUND and egpu is not None:
        out.update({"elasticGPUName": egpu.name, "node": egpu.node, "capacity": dict(egpu.capacity)})
    return out


def _main(argv: list[str] | None = None) -> int:
    files = {filename: partial(crd_yaml, plural) for plural, filename in CRD_FILES.items()}
    return write_main("Write the Elastic GPU API's CRDs as YAML.", files, argv)


if __name__ == "__main__":
    raise SystemExit(_main())
