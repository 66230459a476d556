"""Which of this driver's devices a pod's containers hold through ResourceClaims. Pure, no I/O.

A container names claims in `resources.claims` (`{name, request?}`), each the name of an entry
of the pod's `spec.resourceClaims`; that entry names its ResourceClaim directly
(`resourceClaimName`) or through a template, whose generated claim the pod's
`status.resourceClaimStatuses` names. The claim's allocation results of this driver (only the
request the container names, when it names one) are the container's devices.

A pod served through an extended-resource mapping (`nvidia.com/gpu: 1` on a DRA node, KEP-5004)
is not read here: its request already says what it holds (one whole card per unit), and the
device-plugin path's readers count it from the request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.dra.devices import COMPUTE, DRIVER
from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import PERCENT_PER_CARD, MigProfile

#: A MIG device's name (`core.dra.devices.mig_device`): its profile's slices and memory.
_MIG_DEVICE = re.compile(r"gpu-[0-9]+-mig-[0-9]+-(?P<slices>[1-7])g-(?P<memory>[1-9][0-9]{0,3})gb")


def claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's `spec.resourceClaims` entry name -> its ResourceClaim's name (entries whose
    claim is not generated yet are left out)."""
    spec = pod.get("spec") or {}
    statuses = {str(s.get("name")): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                if isinstance(s, Mapping)}
    out: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        name = entry.get("resourceClaimName") or statuses.get(entry["name"])
        if isinstance(name, str) and name:
            out[entry["name"]] = name
    return out


def container_claims(pod: Mapping[str, Any]) -> dict[str, list[tuple[str, str | None]]]:
    """Container name -> the (ResourceClaim name, request or None) it uses."""
    names = claim_names(pod)
    out: dict[str, list[tuple[str, str | None]]] = {}
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(container, Mapping):
            continue
        for ref in (container.get("resources") or {}).get("claims") or []:
            if not isinstance(ref, Mapping) or ref.get("name") not in names:
                continue
            request = ref.get("request")
            out.setdefault(str(container.get("name")), []).append(
                (names[ref["name"]], request if isinstance(request, str) and request else None))
    return out


def device_compute(result: Mapping[str, Any]) -> Fraction:
    """The compute one allocation result holds, in cards: a card device its consumed
    `compute` percent (no consumed capacity: the whole card), a MIG device its profile's card
    fraction (`core.mig.profiles.card_fraction`, by the profile's name: a result does not
    name the card's model)."""
    name = str(result.get("device", ""))
    mig = _MIG_DEVICE.match(name)
    if mig is not None:
        return card_fraction(MigProfile(int(mig["slices"]), int(mig["memory"])))
    consumed = (result.get("consumedCapacity") or {}).get(COMPUTE)
    if consumed is None:
        return Fraction(1)
    try:
        return min(Fraction(1), parse_quantity(consumed) / PERCENT_PER_CARD)
    except QuantityError:
        return Fraction(1)  # unreadable: count the most it can hold


def claim_compute(claim: Mapping[str, Any], request: str | None = None) -> Fraction:
    """The compute a claim's allocation holds of this driver's devices, in cards (only the
    results of `request`, and of its subrequests, when given)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    total = Fraction(0)
    for result in (allocation.get("devices") or {}).get("results") or []:
        if not isinstance(result, Mapping) or result.get("driver") != DRIVER:
            continue
        served = str(result.get("request", ""))
        if request is not None and served != request and not served.startswith(f"{request}/"):
            continue
        total += device_compute(result)
    return total


def billed_claims(pod: Mapping[str, Any]) -> frozenset[str] | None:
    """The ResourceClaim names the pod is billed for: those of the `spec.resourceClaims`
    entries its `elasticgpu.io/dra-billed-claims` annotation lists (the webhook's: a claim
    shared by several pods is billed on its first user, `core.dra.podclaims`); None: no
    annotation (a pod the webhook did not see), bill every claim it uses."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.DRA_BILLED_CLAIMS)
    if not isinstance(value, str):
        return None
    entries = {v.strip() for v in value.split(",") if v.strip()}
    return frozenset(name for entry, name in claim_names(pod).items() if entry in entries)


def pod_claim_compute(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]
                      ) -> dict[str, Fraction]:
    """Each container's compute held through this driver's ResourceClaims, in cards, from
    `claims` (the pod's namespace's claims by name; a claim not there counts nothing yet).
    Only the claims the pod is billed for (`billed_claims`), each once per pod (on the first
    container naming it): a claim shared by several pods is billed once."""
    billed = billed_claims(pod)
    seen: set[tuple[str, str | None]] = set()
    out: dict[str, Fraction] = {}
    for container, all_refs in container_claims(pod).items():
        refs = [ref for ref in all_refs if (billed is None or ref[0] in billed)
                and ref not in seen]
        seen.update(refs)
        total = sum((claim_compute(claims[name], request) for name, request in refs
                     if name in claims), Fraction(0))
        if total:
            out[container] = total
    return out
