"""An ElasticGPU's reconcile: the inventory check of a pre-created one, and the release.

A pre-created ElasticGPU (not pre-bound to a claim's uid, not bound yet) is checked against
the GPUDevice inventory (`core.claims.inventory.inventory_problem`): `Available`, or `Failed` with the
reason. Once its claim is gone, `core.claims.release.decide_release` releases it (status Released,
reclaim policy Retain) or deletes it, only after a live GET of the claim and a live list of
the claim's namespace's pods agree with the caches: a release is never decided from a cache
alone. While pods that have not stopped use its cards it is kept (Event `WaitingForPods`), and
each one's stop brings it back.
"""

from __future__ import annotations

import logging
from typing import Any

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.controller.claims.caches import ClaimCaches
from elastic_gpu.controller.manager import Context
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.inventory import INVENTORY_REASONS, checked_against_inventory, inventory_problem
from elastic_gpu.core.claims.model import Claim, ClaimRef, ElasticGPUPhase
from elastic_gpu.core.claims.pods import pods_holding
from elastic_gpu.core.claims.release import Keep, MarkReleased, decide_release
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.events import NORMAL, WARNING
from elastic_gpu.kube.informer import Obj
from elastic_gpu.kube.resources import CLAIMS, ELASTICGPUS, PODS

log = logging.getLogger(__name__)


class Reclaimer:
    """Reconciles one ElasticGPU (key `egpu:<name>`) from `caches`."""

    def __init__(self, ctx: Context, caches: ClaimCaches) -> None:
        self.client = ctx.client
        self.recorder = ctx.recorder
        self.caches = caches

    async def _check_inventory(self, obj: Obj, egpu: claim_model.ElasticGPU) -> None:
        """A pre-created ElasticGPU names real cards (`Available`) or says why not (`Failed`,
        reason and message); written only when that changes. A `Failed` one set by anyone
        for another reason is left so."""
        status = obj.get("status") or {}
        if egpu.phase is ElasticGPUPhase.FAILED and \
                status.get("reason") not in INVENTORY_REASONS:
            return
        problem = inventory_problem(egpu, self.caches.inventory())
        if problem is None:
            want: dict[str, Any] = {"phase": ElasticGPUPhase.AVAILABLE.value,
                                    "reason": None, "message": None}
        else:
            want = {"phase": ElasticGPUPhase.FAILED.value, "reason": problem[0].value,
                    "message": problem[1]}
        if all(status.get(k) == v for k, v in want.items()):
            return
        name = str(obj["metadata"]["name"])
        await self.client.patch(ELASTICGPUS.path(name=name, subresource="status"), {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": want})
        if problem is not None:
            log.warning("%s", problem[1])
            self.recorder.record(obj, WARNING, problem[0].value, problem[1])
        elif egpu.phase is ElasticGPUPhase.FAILED:
            self.recorder.record(obj, NORMAL, "Available",
                                 "its node, cards and uuids are in the inventory now")

    async def reconcile_egpu(self, name: str) -> None:
        obj = self.caches.egpus.get(name)
        if obj is None:
            return
        try:
            egpu = api.elasticgpu_from_object(obj)
        except api.ElasticGPUObjectError as err:
            self.recorder.record(obj, WARNING, "InvalidObject", str(err))
            return
        if checked_against_inventory(egpu):
            await self._check_inventory(obj, egpu)
        ref = egpu.claim_ref
        if ref is None:
            return
        claim = await self._claim_of(ref)
        if isinstance(decide_release(egpu, claim), Keep):
            # kept whoever uses it (its claim is there, or it is not releasable): the pods
            # are not read, a parse of every GPU pod's assignment per ElasticGPU otherwise
            # (O(ElasticGPUs x pods) for a new leader's pass over every ElasticGPU)
            return
        decision = decide_release(egpu, claim, pods_holding(egpu, self.caches.pods.items()))
        if isinstance(decision, Keep):
            self._keep(obj, name, decision)
            return
        # the caches say the claim is gone and no pod uses the cards: make sure with the API
        # (the claim, and the pods of its namespace) before releasing anything
        if claim is None and self.caches.claims.get(f"{ref.namespace}/{ref.name}") is None:
            claim = await self._live_claim(ref)
        pods, _ = await self.client.list(PODS.path(ref.namespace))
        decision = decide_release(egpu, claim, pods_holding(egpu, pods))
        if isinstance(decision, Keep):
            self._keep(obj, name, decision)
            return
        if isinstance(decision, MarkReleased):
            await self.client.patch(ELASTICGPUS.path(name=name, subresource="status"), {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": {"phase": ElasticGPUPhase.RELEASED.value,
                           "reason": "ClaimDeleted", "message": decision.message}})
            self.recorder.record(obj, NORMAL, "Released", decision.message)
            return
        try:
            await self.client.delete(ELASTICGPUS.path(name=name), uid=obj["metadata"].get("uid"),
                                     resource_version=obj["metadata"].get("resourceVersion"))
        except NotFound:
            return
        self.recorder.record(obj, NORMAL, "Deleted", f"{decision.message}; reclaim policy "
                             "Delete: the ElasticGPU and its cards are freed")

    def _keep(self, obj: Obj, name: str, decision: Keep) -> None:
        """A kept ElasticGPU whose claim is gone waits for the pods still using its cards:
        each one's stop or deletion brings it back (`ClaimCaches._pod_stopped`)."""
        if not decision.waiting_for:
            return
        for pod in decision.waiting_for:
            self.caches.egpus_held_by.setdefault(pod, set()).add(name)
        self.recorder.record(obj, NORMAL, "WaitingForPods",
                             "its claim is gone; release waits for the pods using its cards: "
                             + ", ".join(decision.waiting_for))

    async def _claim_of(self, ref: ClaimRef) -> Claim | None:
        obj = self.caches.claims.get(f"{ref.namespace}/{ref.name}")
        if obj is None:
            return None
        try:
            return api.claim_from_object(obj)
        except api.ElasticGPUObjectError:
            return None

    async def _live_claim(self, ref: ClaimRef) -> Claim | None:
        try:
            return api.claim_from_object(await self.client.get(CLAIMS.path(ref.namespace,
                                                                           ref.name)))
        except NotFound:
            return None
        except api.ElasticGPUObjectError:
            return None
