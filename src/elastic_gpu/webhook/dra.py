"""The DeviceClasses a pod's ResourceClaims name, for the DRA placement gate
(`core.admission.mutators.dra_gate`; docs/dra.md, "Claims placed by our engine").

Read live at the pod's CREATE: each ResourceClaimTemplate or ResourceClaim the pod names (a
template's claim does not exist yet), and our card class's opt-out annotation. A read that
fails leaves the pod ungated (fails open): kube-scheduler then allocates its claims itself,
as without the allocator, and the allocator reads that allocation as a fact.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.facts import DraClaims
from elastic_gpu.core.admission.mutators.dra_gate import PLACED_CLASSES
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS

log = logging.getLogger(__name__)


def request_classes(devices: Mapping[str, Any]) -> set[str]:
    """The class names of a claim spec's `devices` (exactly and firstAvailable requests)."""
    out: set[str] = set()
    for request in devices.get("requests") or []:
        if not isinstance(request, Mapping):
            continue
        exactly = request.get("exactly")
        if isinstance(exactly, Mapping) and isinstance(exactly.get("deviceClassName"), str):
            out.add(exactly["deviceClassName"])
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, Mapping) and isinstance(sub.get("deviceClassName"), str):
                out.add(sub["deviceClassName"])
    return out


class DraClassLookup:
    """`DraClaims` of one pod by live reads (`reader`: None, before the webhook runs: none)."""

    def __init__(self) -> None:
        self.reader: KubeClient | None = None

    async def __call__(self, namespace: str, pod: Mapping[str, Any]) -> DraClaims:
        entries = (pod.get("spec") or {}).get("resourceClaims") or []
        if self.reader is None or not entries:
            return DraClaims()
        try:
            return await self._lookup(self.reader, namespace, entries)
        except Exception as err:  # fail open: kube-scheduler allocates, as without us
            log.warning("reading the DeviceClasses of a pod's claims in %s: %s; not gated",
                        namespace, err)
            return DraClaims()

    @staticmethod
    async def _lookup(reader: KubeClient, namespace: str, entries: list[Any]) -> DraClaims:
        classes: set[str] = set()
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            try:
                if isinstance(entry.get("resourceClaimTemplateName"), str):
                    obj = await reader.get(RESOURCE_CLAIM_TEMPLATES.path(
                        namespace, entry["resourceClaimTemplateName"]))
                    spec = (obj.get("spec") or {}).get("spec") or {}
                elif isinstance(entry.get("resourceClaimName"), str):
                    obj = await reader.get(RESOURCE_CLAIMS.path(namespace,
                                                                entry["resourceClaimName"]))
                    spec = obj.get("spec") or {}
                else:
                    continue
            except NotFound:
                continue  # the pod waits for it either way; kube-scheduler says so
            classes |= request_classes(spec.get("devices") or {})
        opted_out: set[str] = set()
        for name in sorted(classes & PLACED_CLASSES):
            try:
                cls = await reader.get(DEVICE_CLASSES.path(name=name))
            except NotFound:
                continue
            if ((cls.get("metadata") or {}).get("annotations") or {}).get(
                    ann.DRA_PLACEMENT) == ann.DRA_PLACEMENT_KUBE_SCHEDULER:
                opted_out.add(name)
        return DraClaims(frozenset(classes), frozenset(opted_out))
