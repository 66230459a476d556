"""The webhook's copy of the cluster's card UUIDs: an informer on GPUDevices.

A peer's card pinning (HAMi's `nvidia.com/use-gpuuuid`, `core.peers.hami`) that names no card
of the cluster is refused at create, not left Pending; the UUIDs come from here, through
`ClusterFacts.card_uuids`. While the CRD is not installed, or no GPUDevice is known (a
DRA-only cluster publishes none), the UUIDs are unknown (None) and the list is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from elastic_gpu.kube.resources import GPUDEVICES
from elastic_gpu.webhook.cluster import CrdCache


def _uuid(obj: Mapping[str, Any]) -> str | None:
    spec = obj.get("spec")
    uuid = spec.get("uuid") if isinstance(spec, Mapping) else None
    return uuid if isinstance(uuid, str) and uuid else None


class CardCache(CrdCache[str]):
    """Card UUIDs by GPUDevice (namespace, name); `on_change(uuids)` after each change."""

    kind = "GPUDevice"

    def __init__(self, on_change: Callable[[frozenset[str] | None], None] = lambda _: None,
                 crd_retry_s: float = 10.0) -> None:
        super().__init__(GPUDEVICES, _uuid, crd_retry_s)
        self._notify = on_change

    def uuids(self) -> frozenset[str] | None:
        """The UUIDs known; None while none is (nothing to check against)."""
        return frozenset(self.objects.values()) or None

    def on_change(self) -> None:
        self._notify(self.uuids())
