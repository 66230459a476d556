"""A claim's reconcile: protection, the decision, provisioning, binding and the status writes.

`core.claims.binding.decide` on the caches says what to do; this module does it against the API in the
order that survives a crash between any two writes: the finalizer first (or with the binding),
the ElasticGPU's claimRef, then its phase and the claim's spec.elasticGPUName (in parallel),
then the claim's status,
each skipped when already done and each carrying the object's resourceVersion (a stale cache
gets 409 and a requeue, never a lost update). A deleted claim keeps its finalizer while a pod
that has not finished names it, and a binding begun before its deletion is finished meanwhile
(`core.claims.binding.binding_to_finish`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Iterator, Mapping
from typing import Any

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.controller.claims.caches import CLAIM_KEY, ClaimCaches
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.provisioning import ProvisionError
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.binding import binding_to_finish, decide
from elastic_gpu.core.claims.decisions import Decision, InSync, Provision
from elastic_gpu.core.claims.model import (
    Claim,
    ClaimRef,
    ElasticGPUPhase,
    LostReason,
    PendingReason,
    provisioned_name,
)
from elastic_gpu.core.claims.pods import CLAIM_PROTECTION_FINALIZER, pods_using
from elastic_gpu.kube.client import JSON_PATCH
from elastic_gpu.kube.errors import ApiError, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING
from elastic_gpu.kube.informer import Obj
from elastic_gpu.kube.resources import CLAIMS, ELASTICGPUS


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Overlay(Mapping[str, claim_model.ElasticGPU]):
    """`base` with one more ElasticGPU, without copying `base`."""

    def __init__(self, extra: claim_model.ElasticGPU, base: Mapping[str, claim_model.ElasticGPU]) -> None:
        self.extra = extra
        self.base = base

    def __getitem__(self, key: str) -> claim_model.ElasticGPU:
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
        egpus: Mapping[str, claim_model.ElasticGPU] = self.caches.decoded_egpus
        decision = decide(claim, self.caches.decoded_classes, egpus)
        if CLAIM_PROTECTION_FINALIZER not in finalizers and \
                not isinstance(decision, claim_decisions.Bind | Provision):
            # a claim about to be bound gets the finalizer with spec.elasticGPUName (one write)
            obj = self.caches.wrote(key, await self.client.patch(CLAIMS.path(claim.namespace, claim.name), {
                "metadata": {"finalizers": [*finalizers, CLAIM_PROTECTION_FINALIZER],
                             "resourceVersion": obj["metadata"]["resourceVersion"]}}))
        provisioned_on: str | None = None
        if isinstance(decision, Provision):
            decision, egpus, provisioned_on = await self._provision(obj, claim, egpus)
        if isinstance(decision, claim_decisions.Bind):
            await self._bind(obj, claim, egpus[decision.elastic_gpu], provisioned_on)
            return
        if isinstance(decision, claim_decisions.Pending) and \
                decision.reason is PendingReason.UNSCHEDULABLE:
            self.caches.unschedulable.add(key)
        else:
            self.caches.unschedulable.discard(key)
        if isinstance(decision, claim_decisions.Lost) and \
                decision.reason is LostReason.ELASTICGPU_MISSING and claim.elastic_gpu_name:
            # Lost is final: never from a cache that may just not show the ElasticGPU yet
            try:
                await self.client.get(ELASTICGPUS.path(name=claim.elastic_gpu_name))
            except NotFound:
                pass
            else:
                raise Requeue(f"claim {key}: ElasticGPU {claim.elastic_gpu_name} exists but is "
                              "not in the cache yet")
        egpu = egpus.get(decision.elastic_gpu) if isinstance(decision, InSync) else None
        changed = await self._write_status(obj, decision, egpu)
        if changed and isinstance(decision, claim_decisions.Pending | claim_decisions.Lost):
            reason = "Lost" if isinstance(decision, claim_decisions.Lost) else decision.reason.value
            if isinstance(decision, claim_decisions.Pending) and \
                    decision.reason is PendingReason.UNSCHEDULABLE:
                reason = "ProvisioningFailed"
            waiting = isinstance(decision, claim_decisions.Pending) and \
                decision.reason is PendingReason.WAIT_FOR_FIRST_CONSUMER
            # waiting for a consumer is the normal course of a WaitForFirstConsumer claim
            self.recorder.record(obj, NORMAL if waiting else WARNING, reason, decision.message)
        if isinstance(decision, claim_decisions.Pending) and \
                decision.reason is PendingReason.UNSCHEDULABLE:
            raise Requeue(f"claim {key} unschedulable: {decision.message}")
        if isinstance(decision, Provision):
            raise Requeue(f"claim {key}: provisioning not finished")

    async def _provision(self, obj: Obj, claim: Claim, egpus: Mapping[str, claim_model.ElasticGPU]
                         ) -> tuple[Decision, Mapping[str, claim_model.ElasticGPU], str | None]:
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
                reason = PendingReason(answer.reason)
            except ValueError:
                reason = PendingReason.UNSCHEDULABLE
            return claim_decisions.Pending(reason, answer.message or answer.reason), egpus, None
        name = answer.elastic_gpu or provisioned_name(claim)
        if name not in egpus:
            if answer.result != "Provisioned" or not answer.node:
                raise Requeue(f"extender answered {answer.result} ({answer.decision}); "
                              f"ElasticGPU {name} not in the cache yet")
            # created for this claim just now, pre-bound to it (contract 2): bind it at once
            # instead of waiting for the watch (its cards are the extender's business)
            made = claim_model.ElasticGPU(name=name, capacity=dict(claim.requests), node=answer.node,
                                   shares=(), claim_ref=ClaimRef.of(claim),
                                   class_name=claim.class_name)
            egpus = _Overlay(made, egpus)
        made_on = answer.node if answer.result == "Provisioned" else None
        return decide(claim, self.caches.decoded_classes, egpus), egpus, made_on

    async def _bind(self, obj: Obj, claim: Claim, egpu: claim_model.ElasticGPU,
                    provisioned_on: str | None = None) -> None:
        """ElasticGPU's claimRef first (with the uid), then its phase Bound and the claim's
        spec together, then the claim's status: each write skipped when already done. A claim
        provisioned in this reconcile (`provisioned_on`) gets one Event, Provisioned, that
        says both (a PV's ProvisioningSucceeded): one Event write per claim less at
        claim-creation rates.

        The claimRef is what reserves the ElasticGPU for this claim: once it is written, its
        phase and the claim's spec depend on nothing of each other, so they go in parallel
        (one round trip less per claim: 3 sequential after `/provision`, not 4). Either may
        fail alone; the next reconcile decides Bind again and writes the missing one, and the
        claim's status (what says Bound) waits for both."""
        egpu_obj = self.caches.egpus.get(egpu.name)
        ref = ClaimRef.of(claim)
        if egpu.claim_ref != ref:
            if egpu_obj is None:
                egpu_obj = await self.client.get(ELASTICGPUS.path(name=egpu.name))
            egpu_obj = await self.client.patch(ELASTICGPUS.path(name=egpu.name), {
                "metadata": {"resourceVersion": egpu_obj["metadata"]["resourceVersion"]},
                "spec": {"claimRef": {"namespace": ref.namespace, "name": ref.name,
                                      "uid": ref.uid}}})
        writes: list[Awaitable[Obj | None]] = []
        if egpu_obj is None or \
                (egpu_obj.get("status") or {}).get("phase") != ElasticGPUPhase.BOUND.value:
            writes.append(self._mark_egpu_bound(claim, egpu, egpu_obj))
        finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
        name_it = claim.elastic_gpu_name != egpu.name or \
            CLAIM_PROTECTION_FINALIZER not in finalizers
        if name_it:
            writes.append(self._name_egpu_in_claim(obj, claim, egpu, finalizers))
        # both run to their end (no write is left in flight behind a raised error)
        results = await asyncio.gather(*writes, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if name_it:
            named = results[-1]  # the claim's write, added last
            assert isinstance(named, dict)
            obj = named
        self.caches.unschedulable.discard(claim.key)
        if await self._write_status(obj, claim_decisions.Bind(egpu.name), egpu):
            if provisioned_on is not None:
                self.recorder.record(obj, NORMAL, "Provisioned", f"ElasticGPU {egpu.name} "
                                     f"provisioned on node {provisioned_on} and bound")
            else:
                self.recorder.record(obj, NORMAL, "Bound",
                                     f"bound to ElasticGPU {egpu.name} on node {egpu.node}")
        elif provisioned_on is not None:
            self.recorder.record(obj, NORMAL, "Provisioned",
                                 f"ElasticGPU {egpu.name} provisioned on node {provisioned_on}")

    async def _mark_egpu_bound(self, claim: Claim, egpu: claim_model.ElasticGPU,
                               egpu_obj: Obj | None) -> None:
        # no resourceVersion needed when the cache lacks it (just provisioned): its
        # claimRef, already this claim's, can never point at another claim
        patch: dict[str, Any] = {"status": {"phase": ElasticGPUPhase.BOUND.value,
                                            "reason": "",
                                            "message": f"bound to claim {claim.key}"}}
        if egpu_obj is not None:
            patch["metadata"] = {"resourceVersion": egpu_obj["metadata"]["resourceVersion"]}
        written = await self.client.patch(ELASTICGPUS.path(name=egpu.name, subresource="status"),
                                          patch)
        if egpu.name != provisioned_name(claim):
            # a static binding is news on the ElasticGPU; a provisioned one was made bound
            # (the claim's Provisioned event tells it, one Event write less)
            self.recorder.record(written, NORMAL, "Bound", f"bound to claim {claim.key}")

    async def _name_egpu_in_claim(self, obj: Obj, claim: Claim, egpu: claim_model.ElasticGPU,
                                  finalizers: list[str]) -> Obj:
        """The claim's spec.elasticGPUName, with the protection finalizer if it lacks it."""
        meta: dict[str, Any] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
        if CLAIM_PROTECTION_FINALIZER not in finalizers:
            meta["finalizers"] = [*finalizers, CLAIM_PROTECTION_FINALIZER]
        return self.caches.wrote(claim.key, await self.client.patch(
            CLAIMS.path(claim.namespace, claim.name),
            {"metadata": meta, "spec": {"elasticGPUName": egpu.name}}))

    async def _write_status(self, obj: Obj, decision: Decision,
                            egpu: claim_model.ElasticGPU | None) -> bool:
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

    async def _finish_deletion(self, obj: Obj, claim: Claim, finalizers: list[str]) -> None:
        if CLAIM_PROTECTION_FINALIZER not in finalizers:
            return
        using = pods_using(claim, self.caches.pods_of(claim.key))
        if using:
            begun = binding_to_finish(claim, self.caches.decoded_egpus)
            if begun is not None:  # deleted before the controller bound it: say what it holds
                await self._bind(obj, claim, self.caches.decoded_egpus[begun.elastic_gpu])
            self.recorder.record(obj, NORMAL, "WaitingForPods",
                                 f"deletion waits for pods using the claim: {', '.join(using)}")
            return
        index = finalizers.index(CLAIM_PROTECTION_FINALIZER)
        try:  # JSON patch with a test: remove exactly our entry, never another's
            await self.client.patch(CLAIMS.path(claim.namespace, claim.name), [
                {"op": "test", "path": f"/metadata/finalizers/{index}",
                 "value": CLAIM_PROTECTION_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{index}"}], JSON_PATCH)
        except NotFound:
            return
        except ApiError as err:
            if err.code == 422:  # the test failed: the list changed under us
                raise Requeue(f"claim {claim.key}: finalizers changed") from None
            raise
        self.recorder.record(obj, NORMAL, "Deleted", "no pod uses the claim; finalizer removed")
