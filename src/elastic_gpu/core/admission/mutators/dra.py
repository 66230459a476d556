"""The DRA claims' mutator: `elasticgpu.io/dra-billed-claims` on a pod naming ResourceClaims of
our DeviceClasses, the entries it is billed for (`core.dra.podclaims`: a shared claim on its
first user only). The webhook writes it whatever the pod carried, so a tenant cannot bill
another pod for her claims; the budget keeper reads it."""

from __future__ import annotations

from collections.abc import Mapping

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.jsonpatch import PatchOp, pointer, set_annotation
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.dra.podclaims import billed_annotation


def dra_billing(data: MutationInput) -> list[PatchOp]:
    wanted = billed_annotation(data.pod, data.dra)
    meta = data.pod.get("metadata") or {}
    annotations = meta.get("annotations")
    current = annotations.get(ann.DRA_BILLED_CLAIMS) if isinstance(annotations, Mapping) else None
    if wanted is None:
        # no claim of ours: a value the pod carried is not the webhook's, drop it
        return [] if current is None else [
            {"op": "remove", "path": pointer("metadata", "annotations", ann.DRA_BILLED_CLAIMS)}]
    if current == wanted:
        return []
    return [set_annotation(data.pod, ann.DRA_BILLED_CLAIMS, wanted)]
