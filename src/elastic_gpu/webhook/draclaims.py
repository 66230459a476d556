"""The webhook's live reads of the ResourceClaims and ResourceClaimTemplates a pod names
(`spec.resourceClaims`), for the DRA rules and the quota (`core.admission.dra`,
`core.dra.podclaims`, `core.dra.quota`).

Read live at every review of such a pod, not from a watch: a claim is usually created a moment
before its pod, and whether a shared claim already has a user (`status.reservedFor`) must be as
fresh as it can be. A claim or template that does not exist is `None` (the pod is refused,
`dra-claim-not-found`); any other failure is raised (the review refuses the pod,
`dra-claim-lookup`: it cannot tell what the pod holds). Names go by checked, escaped paths
(`kube.paths`).

The same read feeds the DRA placement gate (`core.admission.mutators.dra_gate`): for the
classes our allocator places that the claims name, the DeviceClass is read for the operator's
opt-out annotation (`elasticgpu.io/dra-placement: kube-scheduler`). That read fails open: a
class that cannot be read counts as opted out, so the pod is not gated and kube-scheduler
allocates its claims itself, as without the allocator (which reads that allocation as a fact).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.mutators.dra_gate import PLACED_CLASSES
from elastic_gpu.core.dra.podclaims import ClaimRef, FoundClaim, PodDraClaims
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS

log = logging.getLogger(__name__)


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
        claims = PodDraClaims(found)
        return PodDraClaims(found, await self._opted_out(claims.classes() & PLACED_CLASSES))

    async def _opted_out(self, classes: frozenset[str]) -> frozenset[str]:
        """Those of `classes` an operator left to kube-scheduler; one that cannot be read
        counts as left to it (fails open: the pod is not gated)."""
        out: set[str] = set()
        for name in sorted(classes):
            self.reads += 1
            try:
                cls = await self.reader.get(DEVICE_CLASSES.path(name=name))
            except NotFound:
                continue
            except Exception as err:  # fail open: kube-scheduler allocates, as without us
                log.warning("reading DeviceClass %s: %s; its claims' pods are not gated",
                            name, err)
                out.add(name)
                continue
            if ((cls.get("metadata") or {}).get("annotations") or {}).get(
                    ann.DRA_PLACEMENT) == ann.DRA_PLACEMENT_KUBE_SCHEDULER:
                out.add(name)
        return frozenset(out)
