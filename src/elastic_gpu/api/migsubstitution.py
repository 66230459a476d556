"""The MIG adapter's rule in the API: MIGSubstitution (group elasticgpu.io, v1alpha, namespaced).

A move of pods from one MIG profile to another (DESIGN.md 7.3) is recorded here, never only in
a process, so a restarted controller or webhook loses none:

    apiVersion: elasticgpu.io/v1alpha
    kind: MIGSubstitution
    metadata: {name: web-1g10gb-to-2g20gb, namespace: default}
    spec:
      selector: {ownerUID: 6f1c...}        # the pods of this owner, or {podName: train-0}
      fromProfile: 1g.10gb
      toProfile: 2g.20gb
      reason: no 1g.10gb free on a node the pods may use; 2g.20gb free on gpu-node-3
      savedPod: {...}                      # a bare pod's manifest (podName rules only)
      savedPodDigest: sha256:...           # recorded with it: the re-created pod must match
      movedPodUID: 0a1b...                 # the pod the adapter deleted

The webhook rewrites a selected pod's `nvidia.com/mig-<from>` to `<to>` at creation
(`core.admission.mutators.mig.mig_substitution`). This module is the one source of the CRD
(`crd_manifest()`; deploy/crds/migsubstitutions.yaml is its YAML form, written by
`python -m elastic_gpu.api.migsubstitution --write deploy/crds` and kept equal by a unit test)
and reads the served objects into `core.mig.rules.SubstitutionRule`. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.api.crd import column, conditions_schema, crd, immutable, to_yaml, write_main
from elastic_gpu.api.group import ELASTICGPU_VERSION as VERSION
from elastic_gpu.api.group import GROUP
from elastic_gpu.core.annotations import MANAGED_BY
from elastic_gpu.core.mig.rules import ADAPTER, MIG_RETURNING, SubstitutionRule
from elastic_gpu.core.resources import MigProfile, ResourceError


class MIGSubstitutionError(ValueError):
    """A MIGSubstitution that cannot be read; the message names the object and the field."""


KIND, PLURAL, SHORT = "MIGSubstitution", "migsubstitutions", "migsub"
CRD_FILE = "migsubstitutions.yaml"
#: A MIG profile as the rule writes it (no `nvidia.com/mig-` prefix): core.resources.MIG_RULE.
PROFILE_PATTERN = r"^[1-7]g\.[1-9][0-9]{0,3}gb(\+me|\+me\.all|\+gfx)?$"
#: A Kubernetes object uid (a UUID) and a pod name (a DNS subdomain).
UID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
POD_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: `core.mig.rules.saved_pod_digest`'s form.
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
#: More containers than a pod could hold is not a pod (bounds the schema's cost too).
MAX_CONTAINERS = 256


def _profile(description: str) -> dict[str, Any]:
    return {"type": "string", "maxLength": 32, "pattern": PROFILE_PATTERN,
            "description": description}


def _open_object(description: str, **more: Any) -> dict[str, Any]:
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
            "description": description, **more}


def _saved_pod_schema() -> dict[str, Any]:
    """A pod manifest's shape, as far as the re-creation needs it (name, and a spec with named
    containers); the rest is kept as written (`x-kubernetes-preserve-unknown-fields`)."""
    container = _open_object("a container of the saved pod", required=["name"], properties={
        "name": {"type": "string", "minLength": 1, "maxLength": 63}})
    spec = _open_object("the saved pod's spec", required=["containers"], properties={
        "containers": {"type": "array", "minItems": 1, "maxItems": MAX_CONTAINERS,
                       "items": container},
        "initContainers": {"type": "array", "maxItems": MAX_CONTAINERS, "items": container}})
    metadata = _open_object("the saved pod's metadata", required=["name"], properties={
        "name": {"type": "string", "minLength": 1, "maxLength": 253,
                 "pattern": POD_NAME_PATTERN}})
    return _open_object(
        "a bare pod's manifest before the move, which the controller re-creates it from "
        "(podName rules only; written by the adapter with savedPodDigest and movedPodUID)",
        required=["metadata", "spec"], properties={
            "apiVersion": {"type": "string", "enum": ["v1"]},
            "kind": {"type": "string", "enum": ["Pod"]},
            "metadata": metadata, "spec": spec})


def crd_manifest() -> dict[str, Any]:
    """The MIGSubstitution CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    spec = {
        "type": "object",
        "required": ["selector", "fromProfile", "toProfile"],
        "x-kubernetes-validations": [
            *immutable("spec"),
            {"rule": "self.fromProfile != self.toProfile",
             "message": "toProfile must differ from fromProfile"},
            {"rule": "has(self.savedPod) == has(self.selector.podName)",
             "message": "savedPod goes with selector.podName: a bare pod is re-created from it, "
                        "an owner re-creates its own pods"},
            {"rule": "has(self.savedPodDigest) == has(self.savedPod)",
             "message": "savedPodDigest goes with savedPod (the adapter records both at a move)"},
            {"rule": "!has(self.savedPod) || has(self.movedPodUID)",
             "message": "movedPodUID goes with savedPod (the uid of the pod the adapter deleted)"},
            {"rule": "!has(self.savedPod) || !has(self.selector.podName) || "
                     "self.savedPod.metadata.name == self.selector.podName",
             "message": "savedPod.metadata.name must be selector.podName"},
        ],
        "properties": {
            "selector": {
                "type": "object",
                "description": "The pods the rule rewrites, in its namespace: those of one owner "
                               "(ownerUID) or one bare pod (podName); exactly one of the two.",
                "x-kubernetes-validations": [{
                    "rule": "has(self.ownerUID) != has(self.podName)",
                    "message": "exactly one of ownerUID and podName"}],
                "properties": {
                    "ownerUID": {"type": "string", "pattern": UID_PATTERN, "maxLength": 36,
                                 "description": "uid of the ReplicaSet, Job or StatefulSet "
                                                "whose pods are rewritten"},
                    "podName": {"type": "string", "minLength": 1, "maxLength": 253,
                                "pattern": POD_NAME_PATTERN,
                                "description": "name of the bare pod that is rewritten"},
                },
            },
            "fromProfile": _profile("the MIG profile the pods ask, e.g. 1g.10gb"),
            "toProfile": _profile("the MIG profile they get instead, e.g. 2g.20gb"),
            "reason": {"type": "string", "maxLength": 1024,
                       "description": "why the controller made the move (shown to users)"},
            "savedPod": _saved_pod_schema(),
            "savedPodDigest": {"type": "string", "maxLength": 71, "pattern": DIGEST_PATTERN,
                               "description": "sha256 of savedPod in canonical JSON, recorded by "
                                              "the adapter at the move; the pod is re-created "
                                              "only if savedPod still matches it"},
            "movedPodUID": {"type": "string", "pattern": UID_PATTERN, "maxLength": 36,
                            "description": "uid of the pod the adapter deleted for this move "
                                           "(a live pod of the name with another uid is never "
                                           "deleted for the rule)"},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "movedPods": {
                "type": "array", "maxItems": 1024,
                "description": "pods running under the rule",
                "items": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "maxLength": 253},
                    "uid": {"type": "string", "maxLength": 36},
                    "node": {"type": "string", "maxLength": 253},
                    "movedAt": {"type": "string", "format": "date-time"},
                }},
            },
            "moved": {"type": "integer", "minimum": 0,
                      "description": "how many pods the rule has moved"},
            "conditions": conditions_schema(),
        },
    }
    schema = {
        "type": "object",
        "description": "A move of pods from one MIG profile to a compatible one, made by the MIG "
                       "adapter; the webhook rewrites the selected pods' request at creation.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    columns = [
        column("From", "string", ".spec.fromProfile", "profile the pods ask"),
        column("To", "string", ".spec.toProfile", "profile they get"),
        column("Owner", "string", ".spec.selector.ownerUID", "uid of the owner selected"),
        column("Pod", "string", ".spec.selector.podName", "bare pod selected"),
        column("Moved", "integer", ".status.moved", "pods moved"),
        column("Reason", "string", ".spec.reason", "why", priority=1),
        column("Age", "date", ".metadata.creationTimestamp", "age"),
    ]
    return crd(KIND, PLURAL, SHORT, "Namespaced", schema, columns, status=True, version=VERSION)


def crd_yaml() -> str:
    header = (f"# {KIND} ({GROUP}/{VERSION}): see docs/mig-adapter.md.\n"
              "# Generated by `python -m elastic_gpu.api.migsubstitution --write deploy/crds` "
              "from\n# elastic_gpu.api.migsubstitution.crd_manifest() (a unit test keeps them "
              "equal).\n")
    return header + to_yaml(crd_manifest())


def rule_from_object(obj: Mapping[str, Any]) -> SubstitutionRule:
    """A served MIGSubstitution as the core's rule; `MIGSubstitutionError` names the object
    and the field it cannot read (the schema keeps the apiserver's from reaching here)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = str(meta.get("name", "?"))
    where = f"{KIND} {meta.get('namespace', '?')}/{name}"
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        raise MIGSubstitutionError(f"{where}: spec is missing")
    selector = spec.get("selector")
    if not isinstance(selector, Mapping):
        raise MIGSubstitutionError(f"{where}: spec.selector is missing")
    owner, pod = selector.get("ownerUID"), selector.get("podName")
    if (owner is None) == (pod is None):
        raise MIGSubstitutionError(f"{where}: spec.selector: exactly one of ownerUID and podName")
    profiles = []
    for field in ("fromProfile", "toProfile"):
        try:
            profiles.append(MigProfile.parse(spec.get(field)))  # type: ignore[arg-type]
        except ResourceError as err:
            raise MIGSubstitutionError(f"{where}: spec.{field}: {err}") from None
    saved = spec.get("savedPod")
    if saved is not None and not isinstance(saved, Mapping):
        raise MIGSubstitutionError(f"{where}: spec.savedPod is not an object")
    notes = meta.get("annotations")
    returning = isinstance(notes, Mapping) and MIG_RETURNING in notes
    labels = meta.get("labels")
    ours = isinstance(labels, Mapping) and labels.get(MANAGED_BY) == ADAPTER
    uid, digest = spec.get("movedPodUID"), spec.get("savedPodDigest")
    return SubstitutionRule(name, str(meta.get("namespace") or "default"), profiles[0],
                            profiles[1], str(owner) if owner is not None else None,
                            str(pod) if pod is not None else None, str(spec.get("reason", "")),
                            saved, returning, str(uid) if uid is not None else None,
                            str(digest) if digest is not None else None, ours)


def _main(argv: list[str] | None = None) -> int:
    return write_main("Write the MIGSubstitution CRD as YAML.", {CRD_FILE: crd_yaml}, argv)


if __name__ == "__main__":
    raise SystemExit(_main())
