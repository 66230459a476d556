"""A claim's reconcile: protection, the decision, provisioning, binding and the status writes.

`core.claims.decide` on the caches says what to do; this module does it against the API in the
order that survives a crash between any two writes: the finalizer first (or with the binding),
the ElasticGPU's claimRef and phase, then the claim's spec.elasticGPUName, then its status,
each skipped when already done and each carrying the object's resourceVersion (a stale cache
gets 409 and a requeue, never a lost update). A deleted claim keeps its finalizer while a pod
that has not finished names it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Mapping
from typing import Any

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.controller.claims.caches import CLAIM_KEY, ClaimCaches
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.provisioning import ProvisionError
from elastic_gpu.core import claims as core
from elastic_gpu.kube.client import JSON_PATCH
from elastic_gpu.kube.errors import ApiError, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING
from elastic_gpu.kube.informer import Obj
from elastic_gpu.kube.resources import CLAIMS, ELASTICGPUS


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Overlay(Mapping[str, core.ElasticGPU]):
    """`base` with one more ElasticGPU, without copying `base`."""

    def __init__(self, extra: core.ElasticGPU, base: Mapping[str, core.ElasticGPU]) -> None:
        self.extra = extra
        self.base = base

    def __getitem__(self, key: str) -> core.ElasticGPU:
        return self.extra if key == self.extra.name else self.base[key]

    def __iter__(self) -> Iterator[str]:
        yield self.extra.name
        yield from (k for k in self.base if k != self.extra.name)

    def __len__(self) -> int:
        return len(self.base) + (self.extra.name not in self.base)


class Requeue(Exception):
    """Retry this key with backoff (not an error worth a stack trace)."""


class ClaimBinder:
    """Reconciles one claim (key `claim:<namespace>/<name>`) from `caches`."""

    def __init__(self, ctx: Context, caches: ClaimCaches) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.recorder = ctx.recorder
        self.caches = caches

    async def reconcile_claim(self, key: str) -> None:
        obj = self.caches.claims.get(key)
        if obj is None:
            self.caches.unschedulable.discard(key)
            return
        unseen = self.caches.unseen_writes.get(key)
        if unseen is not None:
            wait = unseen[1] - time.monotonic()
            if wait > 0:  # the cache is older than our last write: its watch event requeues
                self.caches.queue.add_after(CLAIM_KEY + key, wait)  # (or, if it never comes, this)
                return
            del self.caches.unseen_writes[key]
        try:
            claim = api.claim_from_object(obj)
        except api.ElasticGPUObjectError as err:
            self.recorder.record(obj, WARNING, "InvalidObject", str(err))
            return
        finalizers: list[str] = list((obj.get("metadata") or {}).get("finalizers") or [])
        if claim.deleting:
            await self._finish_deletion(obj, claim, finalizers)
            return
        egpus: Mapping[str, core.ElasticGPU] = self.caches.decoded_egpus
        decision = core.decide(claim, self.caches.decoded_classes, egpus)
        if core.CLAIM_PROTECTION_FINALIZER not in finalizers and \
                not isinstance(decision, core.Bind | core.Provision):
            # a claim about to be bound gets the finalizer with spec.elasticGPUName (one write)
            obj = self.caches.wrote(key, await self.client.patch(CLAIMS.path(claim.namespace, claim.name), {
                "metadata": {"finalizers": [*finalizers, core.CLAIM_PROTECTION_FINALIZER],
                             "resourceVersion": obj["metadata"]["resourceVersion"]}}))
        provisioned_on: str | None = None
        if isinstance(decision, core.Provision):
            decision, egpus, provisioned_on = await self._provision(obj, claim, egpus)
        if isinstance(decision, core.Bind):
            await self._bind(obj, claim, egpus[decision.elastic_gpu], provisioned_on)
            return
        if isinstance(decision, core.Pending) and \
                decision.reason is core.PendingReason.UNSCHEDULABLE:
            self.caches.unschedulable.add(key)
        else:
            self.caches.unschedulable.discard(key)
        if isinstance(decision, core.Lost) and \
                decision.reason is core.LostReason.ELASTICGPU_MISSING and claim.elastic_gpu_name:
            # Lost is final: never from a cache that may just not show the ElasticGPU yet
            try:
                await self.client.get(ELASTICGPUS.path(name=claim.elastic_gpu_name))
            except NotFound:
                pass
            else:
                raise Requeue(f"claim {key}: ElasticGPU {claim.elastic_gpu_name} exists but is "
                              "not in the cache yet")
        egpu = egpus.get(decision.elastic_gpu) if isinstance(decision, core.InSync) else None
        changed = await self._write_status(obj, decision, egpu)
        if changed and isinstance(decision, core.Pending | core.Lost):
            reason = "Lost" if isinstance(decision, core.Lost) else decision.reason.value
            if isinstance(decision, core.Pending) and \
                    decision.reason is core.PendingReason.UNSCHEDULABLE:
                reason = "ProvisioningFailed"
            waiting = isinstance(decision, core.Pending) and \
                decision.reason is core.PendingReason.WAIT_FOR_FIRST_CONSUMER
            # waiting for a consumer is the normal course of a WaitForFirstConsumer claim
            self.recorder.record(obj, NORMAL if waiting else WARNING, reason, decision.message)
        if isinstance(decision, core.Pending) and \
                decision.reason is core.PendingReason.UNSCHEDULABLE:
            raise Requeue(f"claim {key} unschedulable: {decision.message}")
        if isinstance(decision, core.Provision):
            raise Requeue(f"claim {key}: provisioning not finished")

    async def _provision(self, obj: Obj, claim: core.Claim, egpus: Mapping[str, core.ElasticGPU]
                         ) -> tuple[core.Decision, Mapping[str, core.ElasticGPU], str | None]:
        """Ask the extender; return the decision that follows (Bind to what it made, Pending
        with its reason), the ElasticGPUs including the new one, and the node it was made on
        (None unless the extender created it now)."""
        try:
            answer = await self.ctx.extender.provision(claim.namespace, claim.name, claim.uid)
        except ProvisionError as err:
            self.recorder.record(obj, WARNING, "ProvisioningFailed", str(err))
            raise
        if answer.result == "Pending":
            try:
                reason = core.PendingReason(answer.reason)
            except ValueError:
                reason = core.PendingReason.UNSCHEDULABLE
            return core.Pending(reason, answer.message or answer.reason), egpus, None
        name = answer.elastic_gpu or core.provisioned_name(claim)
        if name not in egpus:
            if answer.result != "Provisioned" or not answer.node:
                raise Requeue(f"extender answered {answer.result} ({answer.decision}); "
                              f"ElasticGPU {name} not in the cache yet")
            # created for this claim just now, pre-bound to it (contract 2): bind it at once
            # instead of waiting for the watch (its cards are the extender's business)
            made = core.ElasticGPU(name=name, capacity=dict(claim.requests), node=answer.node,
                                   shares=(), claim_ref=core.ClaimRef.of(claim),
                                   class_name=claim.class_name)
            egpus = _Overlay(made, egpus)
        made_on = answer.node if answer.result == "Provisioned" else None
        return core.decide(claim, self.caches.decoded_classes, egpus), egpus, made_on

    async def _bind(self, obj: Obj, claim: core.Claim, egpu: core.ElasticGPU,
                    provisioned_on: str | None = None) -> None:
        """ElasticGPU first (claimRef with the uid, phase Bound), then the claim's spec, then
        the claim's status: each write skipped when already done. A claim provisioned in this
        reconcile (`provisioned_on`) gets one Event, Provisioned, that says both (a PV's
        ProvisioningSucceeded): one Event write per claim less at claim-creation rates."""
        egpu_obj = self.caches.egpus.get(egpu.name)
        ref = core.ClaimRef.of(claim)
        if egpu.claim_ref != ref:
            if egpu_obj is None:
                egpu_obj = await self.client.get(ELASTICGPUS.path(name=egpu.name))
            egpu_obj = await self.client.patch(ELASTICGPUS.path(name=egpu.name), {
                "metadata": {"resourceVersion": egpu_obj["metadata"]["resourceVersion"]},
                "spec": {"claimRef": {"namespace": ref.namespace, "name": ref.name,
                                      "uid": ref.uid}}})
        if egpu_obj is None or \
                (egpu_obj.get("status") or {}).get("phase") != core.ElasticGPUPhase.BOUND.value:
            # no resourceVersion needed when the cache lacks it (just provisioned): its
            # claimRef, already this claim's, can never point at another claim
            patch: dict[str, Any] = {"status": {"phase": core.ElasticGPUPhase.BOUND.value,
                                                "reason": "",
                                                "message": f"bound to claim {claim.key}"}}
            if egpu_obj is not None:
                patch["metadata"] = {"resourceVersion": egpu_obj["metadata"]["resourceVersion"]}
            egpu_obj = await self.client.patch(ELASTICGPUS.path(name=egpu.name, subresource="status"),
                                               patch)
            if egpu.name != core.provisioned_name(claim):
                # a static binding is news on the ElasticGPU; a provisioned one was made bound
                # (the claim's Provisioned and Bound events tell it, one Event write less)
                self.recorder.record(egpu_obj, NORMAL, "Bound", f"bound to claim {claim.key}")
        finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
        if claim.elastic_gpu_name != egpu.name or core.CLAIM_PROTECTION_FINALIZER not in finalizers:
            meta: dict[str, Any] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            if core.CLAIM_PROTECTION_FINALIZER not in finalizers:
                meta["finalizers"] = [*finalizers, core.CLAIM_PROTECTION_FINALIZER]
            obj = self.caches.wrote(claim.key, await self.client.patch(
                CLAIMS.path(claim.namespace, claim.name),
                {"metadata": meta, "spec": {"elasticGPUName": egpu.name}}))
        self.caches.unschedulable.discard(claim.key)
        if await self._write_status(obj, core.Bind(egpu.name), egpu):
            if provisioned_on is not None:
                self.recorder.record(obj, NORMAL, "Provisioned", f"ElasticGPU {egpu.name} "
                                     f"provisioned on node {provisioned_on} and bound")
            else:
                self.recorder.record(obj, NORMAL, "Bound",
                                     f"bound to ElasticGPU {egpu.name} on node {egpu.node}")
        elif provisioned_on is not None:
            self.recorder.record(obj, NORMAL, "Provisioned",
                                 f"ElasticGPU {egpu.name} provisioned on node {provisioned_on}")

    async def _write_status(self, obj: Obj, decision: core.Decision,
                            egpu: core.ElasticGPU | None) -> bool:
        """Patch the claim's status if it differs from what the decision gives; True if so."""
        status = api.claim_status(decision, obj, _now(), egpu)
        current = obj.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return False
        meta = obj["metadata"]
        self.caches.wrote(f"{meta['namespace']}/{meta['name']}", await self.client.patch(
            CLAIMS.path(meta["namespace"], meta["name"], "status"),
            {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}))
        return True

    async def _finish_deletion(self, obj: Obj, claim: core.Claim, finalizers: list[str]) -> None:
        if core.CLAIM_PROTECTION_FINALIZER not in finalizers:
            return
        using = core.pods_using(claim, self.caches.pods_of(claim.key))
        if using:
            self.recorder.record(obj, NORMAL, "WaitingForPods",
                                 f"deletion waits for pods using the claim: {', '.join(using)}")
            return
        index = finalizers.index(core.CLAIM_PROTECTION_FINALIZER)
        try:  # JSON patch with a test: remove exactly our entry, never another's
            await self.client.patch(CLAIMS.path(claim.namespace, claim.name), [
                {"op": "test", "path": f"/metadata/finalizers/{index}",
                 "value": core.CLAIM_PROTECTION_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{index}"}], JSON_PATCH)
        except NotFound:
            return
        except ApiError as err:
            if err.code == 422:  # the test failed: the list changed under us
                raise Requeue(f"claim {claim.key}: finalizers changed") from None
            raise
        self.recorder.record(obj, NORMAL, "Deleted", "no pod uses the claim; finalizer removed")
