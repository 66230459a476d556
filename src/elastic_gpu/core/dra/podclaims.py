"""A pod's ResourceClaims at admission: which it names, which ask our classes, what each of its
containers is counted for, and which claims the pod bills. Pure, no I/O.

The webhook reads each claim and template a pod names (`spec.resourceClaims`) live and hands
them here as `PodDraClaims`. A claim **shared** by several pods (an entry naming a
`resourceClaimName`) is counted once, on its **first user**: the pod created while the claim is
reserved for no pod (`status.reservedFor` empty). A later pod sharing it carries neither its
quota nor its GPU time, and its `elasticgpu.io/dra-billed-claims` annotation leaves the entry
out. A template makes a claim of the pod's own: always the pod's. Two pods created together
before either is scheduled are both "first" (counted twice: quota errs on refusing, never on
admitting); and when the first user ends while another still runs, the claim's quota leaves
with it (its pods' ResourceQuota counts running pods, not claims) while the budget keeps billing
none of the others: both are said in docs/dra.md.

Inside one pod a claim is counted once too: on the first container (sidecars, then containers)
whose `resources.claims` names its entry, or the first container when none does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core.dra.quota import Demand, asks_ours, claim_demand
from elastic_gpu.core.request import lifetime_containers


@dataclass(frozen=True)
class ClaimRef:
    """One `spec.resourceClaims` entry: the ResourceClaim it names, or the template."""

    entry: str
    name: str
    template: bool


@dataclass(frozen=True)
class FoundClaim:
    """A claim or template as the webhook read it: its claim spec, and for a ResourceClaim the
    pods it is reserved for now (`status.reservedFor` names)."""

    spec: Mapping[str, Any]
    reserved_for: tuple[str, ...] = ()


def request_classes(spec: Mapping[str, Any]) -> frozenset[str]:
    """The DeviceClass names a claim spec's `devices.requests` name (`exactly` and
    `firstAvailable` subrequests)."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: set[str] = set()
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, Mapping):
            continue
        exactly = request.get("exactly")
        if isinstance(exactly, Mapping) and isinstance(exactly.get("deviceClassName"), str):
            out.add(exactly["deviceClassName"])
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, Mapping) and isinstance(sub.get("deviceClassName"), str):
                out.add(sub["deviceClassName"])
    return frozenset(out)


@dataclass(frozen=True)
class PodDraClaims:
    """What the webhook found for each entry the pod names (None: it does not exist), and which
    of our DeviceClasses an operator left to kube-scheduler (the class annotation
    `elasticgpu.io/dra-placement: kube-scheduler`; `mutators.dra_gate`)."""

    found: Mapping[str, FoundClaim | None] = field(default_factory=dict)
    opted_out: frozenset[str] = frozenset()

    def classes(self) -> frozenset[str]:
        """The DeviceClasses the pod's claims and claim templates name."""
        return frozenset().union(*(request_classes(claim.spec)
                                   for claim in self.found.values() if claim is not None))

    def ours(self) -> dict[str, FoundClaim]:
        """The entries whose claim asks a device of our DeviceClasses."""
        return {entry: claim for entry, claim in self.found.items()
                if claim is not None and asks_ours(claim.spec)}

    def missing(self) -> list[str]:
        return sorted(entry for entry, claim in self.found.items() if claim is None)


def claim_refs(pod: Mapping[str, Any]) -> list[ClaimRef]:
    """The pod's `spec.resourceClaims` entries that name a claim or a template."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    out: list[ClaimRef] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if isinstance(claim, str) and claim:
            out.append(ClaimRef(entry["name"], claim, False))
        elif isinstance(template, str) and template:
            out.append(ClaimRef(entry["name"], template, True))
    return out


def billed_entries(pod: Mapping[str, Any], dra: PodDraClaims) -> list[str]:
    """The entries of our classes this pod is counted for: every template's, and a shared
    claim's while it is reserved for no other pod (the first user)."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    ours = dra.ours()
    refs = {ref.entry: ref for ref in claim_refs(pod)}
    return sorted(entry for entry, claim in ours.items()
                  if entry in refs and (refs[entry].template
                                        or not [p for p in claim.reserved_for if p != name]))


def container_demand(pod: Mapping[str, Any], dra: PodDraClaims,
                     all_cards: int = 1) -> dict[str, Demand]:
    """Container name -> the quota demand of the claims the pod bills, each claim on its first
    container (sidecars, then containers) that names it, else on the first container."""
    billed = billed_entries(pod, dra)
    if not billed:
        return {}
    containers = lifetime_containers(pod)
    out: dict[str, Demand] = {}
    for entry in billed:
        claim = dra.found[entry]
        assert claim is not None
        demand = claim_demand(claim.spec, all_cards)
        if not demand or not containers:
            continue
        owner = next((item.name for item in containers
                      if any(isinstance(ref, Mapping) and ref.get("name") == entry
                             for ref in (item.resources.get("claims") or []))),
                     containers[0].name)
        out[owner] = out.get(owner, Demand()) + demand
    return out


def billed_annotation(pod: Mapping[str, Any], dra: PodDraClaims) -> str | None:
    """The value of `elasticgpu.io/dra-billed-claims` for a pod naming claims of our classes
    (the entries it bills, comma-separated; "" for none), None for a pod that names none."""
    if not dra.ours():
        return None
    return ",".join(billed_entries(pod, dra))

