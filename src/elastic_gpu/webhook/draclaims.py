"""The webhook's live reads of the ResourceClaims and ResourceClaimTemplates a pod names
(`spec.resourceClaims`), for the DRA rules and the quota (`core.admission.dra`,
`core.dra.podclaims`, `core.dra.quota`).

Read live at every review of such a pod, not from a watch: a claim is usually created a moment
before its pod, and whether a shared claim already has a user (`status.reservedFor`) must be as
fresh as it can be. A claim or template that does not exist is `None` (the pod is refused,
`dra-claim-not-found`); any other failure is raised (the review refuses the pod,
`dra-claim-lookup`: it cannot tell what the pod holds). Names go by checked, escaped paths
(`kube.paths`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.core.dra.podclaims import ClaimRef, FoundClaim, PodDraClaims
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS


def found_claim(obj: Mapping[str, Any], template: bool) -> FoundClaim:
    """A ResourceClaim (or a template, whose claim spec is `spec.spec`) as the rules read it."""
    spec = obj.get("spec") or {}
    if template:
        spec = spec.get("spec") or {} if isinstance(spec, Mapping) else {}
    reserved = (obj.get("status") or {}).get("reservedFor") or []
    users = tuple(str(r.get("name")) for r in reserved
                  if isinstance(r, Mapping) and r.get("resource", "pods") == "pods")
    return FoundClaim(spec if isinstance(spec, Mapping) else {}, users)


class DraClaimReader:
    """`await reader(namespace, refs)` -> what each entry names (`PodDraClaims`)."""

    def __init__(self) -> None:
        #: `kube.client.KubeClient` (set when the server runs); None: nothing is read
        self.reader: Any = None
        #: live GETs made
        self.reads = 0

    async def __call__(self, namespace: str, refs: Sequence[ClaimRef]) -> PodDraClaims:
        found: dict[str, FoundClaim | None] = {}
        if self.reader is None:
            return PodDraClaims()
        for ref in refs:
            resource = RESOURCE_CLAIM_TEMPLATES if ref.template else RESOURCE_CLAIMS
            path = resource.path(namespace, ref.name)  # checked before anything is sent
            self.reads += 1
            try:
                obj = await self.reader.get(path)
            except NotFound:
                found[ref.entry] = None
                continue
            found[ref.entry] = found_claim(obj, ref.template)
        return PodDraClaims(found)
