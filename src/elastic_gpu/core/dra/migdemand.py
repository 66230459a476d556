"""Dynamic MIG's demand on DRA nodes: the MIG instances waiting claims ask by profile. Pure.

A claim of the MIG class (`mig.gpu.elasticgpu.io`) asks a profile with a CEL selector on the
device's `profile` attribute (docs/dra.md, "A MIG instance by profile"):

    device.attributes["gpu.elasticgpu.io"].profile == "1g.10gb"

`claim_profiles` reads that equality (the one shape docs/dra.md documents; any other
expression is no demand: the controller cannot tell which profile would serve it) and a
request's `count` (default 1; `allocationMode: All` is no demand). `pod_claim_demand` turns a
waiting pod's unallocated claims of the class into the planner's `MigDemand`s, keyed by the
claim (`core.dra.inventory.claim_key`, `#1`, `#2`... for further instances), so a claim shared
by several waiting pods is one demand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from elastic_gpu.core.dra.classes import MIG_CLASS
from elastic_gpu.core.dra.inventory import claim_key
from elastic_gpu.core.dra.podclaims import claim_refs
from elastic_gpu.core.mig.cardstate import MigDemand
from elastic_gpu.core.resources import MigProfile, ResourceError

#: `device.attributes["gpu.elasticgpu.io"].profile == "<profile>"`, either side
_PROFILE = re.compile(
    r'^\s*(?:device\.attributes\["gpu\.elasticgpu\.io"\]\.profile\s*==\s*"([^"\\]+)"'
    r'|"([^"\\]+)"\s*==\s*device\.attributes\["gpu\.elasticgpu\.io"\]\.profile)\s*$')


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def selector_profile(expression: str) -> MigProfile | None:
    """The profile a CEL selector asks by equality, or None."""
    found = _PROFILE.match(expression)
    if found is None:
        return None
    try:
        return MigProfile.parse(found.group(1) or found.group(2))
    except ResourceError:
        return None


def claim_profiles(spec: Mapping[str, Any]) -> list[MigProfile]:
    """One profile per MIG instance a claim spec asks of the MIG class by profile."""
    out: list[MigProfile] = []
    for request in _mapping(spec.get("devices")).get("requests") or []:
        exactly = _mapping(_mapping(request).get("exactly"))
        if exactly.get("deviceClassName") != MIG_CLASS \
                or exactly.get("allocationMode", "ExactCount") != "ExactCount":
            continue
        profiles = {p for p in (selector_profile(str(_mapping(s).get("cel", {}).get(
            "expression", ""))) for s in exactly.get("selectors") or []) if p is not None}
        count = exactly.get("count", 1)
        if len(profiles) == 1 and isinstance(count, int) and 0 < count <= 7:
            out += [next(iter(profiles))] * count
    return out


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: named ones, and its templates' claims as
    `status.resourceClaimStatuses` names them (none before kube-controller-manager made them)."""
    made = {str(_mapping(s).get("name")): _mapping(s).get("resourceClaimName")
            for s in _mapping(pod.get("status")).get("resourceClaimStatuses") or []}
    names = []
    for ref in claim_refs(pod):
        name = made.get(ref.entry) if ref.template else ref.name
        if isinstance(name, str) and name:
            names.append(name)
    return names


def pod_claim_demand(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
                     nodes: frozenset[str] | None) -> list[MigDemand]:
    """A waiting pod's MIG demand through claims: `claims` by `<namespace>/<name>`; an
    allocated claim, or one not seen yet, asks nothing. `nodes`: where the pod may run."""
    namespace = str(_mapping(pod.get("metadata")).get("namespace", ""))
    out: list[MigDemand] = []
    for name in pod_claim_names(pod):
        claim = claims.get(f"{namespace}/{name}")
        if claim is None or _mapping(claim.get("status")).get("allocation"):
            continue
        key = claim_key(namespace, name)
        for k, profile in enumerate(claim_profiles(_mapping(claim.get("spec")))):
            out.append(MigDemand(key if k == 0 else f"{key}#{k}", profile, nodes))
    return out
