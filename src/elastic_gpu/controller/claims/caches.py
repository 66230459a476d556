"""The claims controller's caches: the informers it reads, the indexes kept from their events,
and which keys each event enqueues (`claim:<namespace>/<name>`, `egpu:<name>`).

Kept apart from the reconciles so that what a watch event triggers can be read in one place:
a claim's change requeues it; a class's change requeues its unbound claims; an ElasticGPU's
change requeues it, its claimRef's claim and the claims naming it; a pod's change requeues the
claims it names and, when it stops, the ElasticGPUs whose release waits for it; a GPU pod's
end or an ElasticGPU's deletion retries the Unschedulable claims (`capacity_freed`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.api import gpudevice
from elastic_gpu.controller.manager import Context
from elastic_gpu.core import annotations as ann
from elastic_gpu.core import podlife
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.inventory import InventoryCard, checked_against_inventory
from elastic_gpu.core.claims.model import ClaimPhase, GPUClass
from elastic_gpu.kube.informer import Handler, Obj, object_key, resource_version
from elastic_gpu.kube.resources import CLAIMS, CLASSES, ELASTICGPUS, GPUDEVICES, PODS
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

CLAIM_KEY = "claim:"
EGPU_KEY = "egpu:"
#: how long a claim waits for the watch to show our own last write before reconciling anyway
UNSEEN_WRITE_WAIT_S = 5.0
#: after capacity may have freed, retry Unschedulable claims this soon (the extender's own
#: watch must see the freeing first; further retries back off from the base delay)
CAPACITY_RETRY_S = 0.2


def _pod_claim_names(pod: Mapping[str, Any]) -> set[str]:
    """Claim names a pod's annotations mention (raw values: the safe side for the index)."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return {v for k, v in notes.items()
            if isinstance(k, str) and k.startswith(ann.CLAIM_PREFIX) and isinstance(v, str)}


def _holds_gpu(pod: Mapping[str, Any]) -> bool:
    return ann.ASSIGNMENT in ((pod.get("metadata") or {}).get("annotations") or {}) or \
        bool(_pod_claim_names(pod))


class _Reverse:
    """item -> the one name it refers to (or none), and name -> the items referring to it,
    kept from events so that finding who refers to a name is no scan of a whole cache."""

    def __init__(self) -> None:
        self._of: dict[str, str] = {}
        self._to: dict[str, set[str]] = {}

    def set(self, item: str, name: str | None) -> None:
        before = self._of.get(item)
        if before == name:
            return
        if before is not None:
            self._of.pop(item)
            items = self._to[before]
            items.discard(item)
            if not items:
                del self._to[before]
        if name is not None:
            self._of[item] = name
            self._to.setdefault(name, set()).add(item)

    def referring_to(self, name: str) -> list[str]:
        return sorted(self._to.get(name, ()))


def _named_egpu(claim: Obj) -> str | None:
    name = (claim.get("spec") or {}).get("elasticGPUName")
    return name if isinstance(name, str) and name else None


def _claim_ref_key(egpu: Obj) -> str | None:
    ref = (egpu.get("spec") or {}).get("claimRef") or {}
    if isinstance(ref, Mapping) and ref.get("namespace") and ref.get("name"):
        return f"{ref['namespace']}/{ref['name']}"
    return None


class ClaimCaches:
    """The shared informers the claims controller reads and what it keeps from their events;
    each event enqueues the keys it may change on `queue`."""

    def __init__(self, ctx: Context, queue: WorkQueue[str]) -> None:
        self.queue = queue
        f = ctx.informers
        self.claims = f.informer(CLAIMS.path(), "elasticgpuclaims")
        self.classes = f.informer(CLASSES.path(), "elasticgpuclasses")
        self.egpus = f.informer(ELASTICGPUS.path(), "elasticgpus")
        self.pods = f.informer(PODS.path(), "pods")
        # (without the GPUDevice CRD there is no inventory: pre-created ElasticGPUs are Failed)
        self.devices = f.informer(GPUDEVICES.path(), "gpudevices", missing_ok=True)
        #: claim key (ns/name) -> pod keys whose annotations name it
        self.pods_by_claim: dict[str, set[str]] = {}
        #: pod key -> ElasticGPUs whose release waits for it (`core.claims.pods.pods_holding`)
        self.egpus_held_by: dict[str, set[str]] = {}
        #: claim keys last answered Unschedulable
        self.unschedulable: set[str] = set()
        #: claim key -> (resourceVersion, deadline) of our last write the cache has not shown
        #: yet: reconciling from the older cached copy would redo work (a second /provision)
        #: and meet 409s, so the claim waits for its watch event (at most until the deadline)
        self.unseen_writes: dict[str, tuple[str, float]] = {}
        #: claim key -> the ElasticGPU its spec names; ElasticGPU -> the claim its claimRef names
        self.claims_naming = _Reverse()
        self.egpus_referring = _Reverse()
        #: the caches' classes and ElasticGPUs decoded once per change (not per reconcile)
        self.decoded_classes: dict[str, GPUClass] = {}
        self.decoded_egpus: dict[str, claim_model.ElasticGPU] = {}
        self.claims.add_handler(Handler(
            on_add=self.claim_changed, on_update=lambda _o, n: self.claim_changed(n),
            on_delete=self._claim_deleted))
        self.classes.add_handler(Handler(
            on_add=self._class_changed, on_update=lambda _o, n: self._class_changed(n),
            on_delete=self._class_deleted))
        self.egpus.add_handler(Handler(
            on_add=self._egpu_changed, on_update=lambda _o, n: self._egpu_changed(n),
            on_delete=self._egpu_deleted))
        self.pods.add_handler(Handler(
            on_add=self._pod_added, on_update=self._pod_updated, on_delete=self._pod_deleted))
        self.devices.add_handler(Handler(
            on_add=lambda _o: self._inventory_changed(),
            on_update=lambda o, n: self._inventory_changed() if o.get("spec") != n.get("spec")
            else None,  # a heartbeat changes nothing of the inventory
            on_delete=lambda _o: self._inventory_changed()))

    # ------------------------------------------------------------------ event handlers

    def claim_changed(self, obj: Obj, *, resync: bool = False) -> None:
        key = object_key(obj)
        seen = self.unseen_writes.get(key)
        if seen is not None and seen[0] == resource_version(obj):
            del self.unseen_writes[key]  # the cache has caught up with our last write
        self.claims_naming.set(key, _named_egpu(obj))
        self.queue.add(CLAIM_KEY + key, resync=resync)

    def _claim_deleted(self, obj: Obj) -> None:
        key = object_key(obj)
        self.unseen_writes.pop(key, None)
        self.unschedulable.discard(key)
        self.claims_naming.set(key, None)
        for egpu in self.egpus_referring.referring_to(key):
            self.queue.add(EGPU_KEY + egpu)

    def _class_changed(self, obj: Obj) -> None:
        name = (obj.get("metadata") or {}).get("name")
        try:
            self.decoded_classes[str(name)] = api.class_from_object(obj)
        except api.ElasticGPUObjectError as err:
            log.warning("ignoring %s", err)
            self.decoded_classes.pop(str(name), None)
        for claim in self.claims.items():
            if (claim.get("spec") or {}).get("egpuClassName") == name and \
                    (claim.get("status") or {}).get("phase") != ClaimPhase.BOUND.value:
                self.queue.add(CLAIM_KEY + object_key(claim))

    def _class_deleted(self, obj: Obj) -> None:
        self.decoded_classes.pop(object_key(obj), None)

    def _egpu_changed(self, obj: Obj) -> None:
        key = object_key(obj)
        try:
            self.decoded_egpus[key] = api.elasticgpu_from_object(obj)
        except api.ElasticGPUObjectError as err:
            log.warning("ignoring %s", err)
            self.decoded_egpus.pop(key, None)
        self.egpus_referring.set(key, _claim_ref_key(obj))
        self._egpu_touched(obj)

    def _egpu_touched(self, obj: Obj) -> None:
        key = object_key(obj)
        self.queue.add(EGPU_KEY + key)
        ref = _claim_ref_key(obj)
        if ref is not None:
            self.queue.add(CLAIM_KEY + ref)
        for claim in self.claims_naming.referring_to(key):  # claims naming it statically
            self.queue.add(CLAIM_KEY + claim)

    def _egpu_deleted(self, obj: Obj) -> None:
        self.decoded_egpus.pop(object_key(obj), None)
        self.egpus_referring.set(object_key(obj), None)
        self._egpu_touched(obj)
        self.capacity_freed()

    def _inventory_changed(self) -> None:
        """The cards may differ: check the pre-created ElasticGPUs again."""
        for key, egpu in self.decoded_egpus.items():
            if checked_against_inventory(egpu):
                self.queue.add(EGPU_KEY + key)

    def _index_pod(self, pod: Obj, add: bool) -> None:
        key = object_key(pod)
        ns = (pod.get("metadata") or {}).get("namespace", "")
        for claim in _pod_claim_names(pod):
            ckey = f"{ns}/{claim}"
            pods = self.pods_by_claim.setdefault(ckey, set())
            if add:
                pods.add(key)
            else:
                pods.discard(key)
                if not pods:
                    del self.pods_by_claim[ckey]
            self.queue.add(CLAIM_KEY + ckey)

    def _pod_added(self, pod: Obj) -> None:
        self._index_pod(pod, True)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if _pod_claim_names(old) != _pod_claim_names(new):
            self._index_pod(old, False)
        self._index_pod(new, True)
        if podlife.stopped(new) and not podlife.stopped(old):
            self._pod_stopped(new)
            if _holds_gpu(new):
                self.capacity_freed()

    def _pod_deleted(self, pod: Obj) -> None:
        self._index_pod(pod, False)
        self._pod_stopped(pod)
        if _holds_gpu(pod) and not podlife.stopped(pod):
            self.capacity_freed()

    def _pod_stopped(self, pod: Obj) -> None:
        """The ElasticGPUs kept for this pod are looked at again."""
        for name in self.egpus_held_by.pop(object_key(pod), ()):
            self.queue.add(EGPU_KEY + name)

    def capacity_freed(self) -> None:
        """GPU capacity may have freed: retry every Unschedulable claim soon, backoff reset."""
        for key in self.unschedulable:
            self.queue.forget(CLAIM_KEY + key)
            self.queue.add_after(CLAIM_KEY + key, CAPACITY_RETRY_S)

    # ------------------------------------------------------------------ reading the caches

    def pods_of(self, key: str) -> list[Obj]:
        return [pod for p in sorted(self.pods_by_claim.get(key, ()))
                if (pod := self.pods.get(p)) is not None]

    def inventory(self) -> dict[str, dict[int, InventoryCard]]:
        out: dict[str, dict[int, InventoryCard]] = {}
        for obj in self.devices.items():
            try:
                node, card = gpudevice.card_from_object(obj)
            except gpudevice.GPUDeviceError as err:
                log.debug("GPUDevice skipped: %s", err)
                continue
            out.setdefault(node, {})[card.index] = InventoryCard(
                card.uuid, frozenset(i.uuid for i in card.mig))
        return out

    def wrote(self, key: str, obj: Obj) -> Obj:
        """Remember the resourceVersion of a claim we just wrote until the cache shows it."""
        version = resource_version(obj)
        cached = self.claims.get(key)
        if cached is None or resource_version(cached) != version:
            self.unseen_writes[key] = (version, time.monotonic() + UNSEEN_WRITE_WAIT_S)
        return obj
