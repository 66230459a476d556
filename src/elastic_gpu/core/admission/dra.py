"""Admission's DRA rules: a pod's ResourceClaims of our DeviceClasses (`core.dra.podclaims`).
Pure, no I/O.

- Every ResourceClaim and ResourceClaimTemplate a pod names must exist when it is created
  (`dra-claim-not-found`): the webhook counts them in the pod's quota and budget, which it
  cannot do for a claim it cannot read.
- A pod asks a GPU one way: a pod asking one through a claim of our classes and through
  device-plugin names (any container, `nvidia.com/gpu` included) is refused, naming both
  (`dra-and-device-plugin`): a node serves one of the two paths, so such a pod could never run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.core.admission.rules import AdmissionRule, Refusal
from elastic_gpu.core.dra.podclaims import PodDraClaims, claim_refs
from elastic_gpu.core.dra.quota import OUR_CLASSES
from elastic_gpu.core.request import ContainerRequest


def _kind(template: bool) -> str:
    return "ResourceClaimTemplate" if template else "ResourceClaim"


def check_dra(pod: Mapping[str, Any], dra: PodDraClaims,
              requests: Sequence[ContainerRequest]) -> list[Refusal]:
    """The DRA rules `pod` breaks, with `dra` the claims found for it."""
    refs = {ref.entry: ref for ref in claim_refs(pod)}
    refusals = [Refusal(AdmissionRule.DRA_CLAIM_NOT_FOUND, f"spec.resourceClaims[{entry}]",
                        refs[entry].name,
                        f"{_kind(refs[entry].template)} {refs[entry].name} does not exist in "
                        "the pod's namespace; create it before the pod")
                for entry in dra.missing() if entry in refs]
    ours = dra.ours()
    plugin = [r for r in requests if r.wants_gpu]
    if ours and plugin:
        claims = ", ".join(f"{_kind(refs[e].template)} {refs[e].name}" for e in sorted(ours)
                           if e in refs)
        names = "; ".join(f"container {r.name}: {', '.join(r.resources)}" for r in plugin)
        refusals.append(Refusal(
            AdmissionRule.DRA_AND_DEVICE_PLUGIN, "spec.resourceClaims", "",
            f"the pod asks a GPU both through {claims} (DeviceClass "
            f"{' or '.join(sorted(OUR_CLASSES))}) and through device-plugin resources "
            f"({names}); a node serves one of the two, so ask one way"))
    return refusals
