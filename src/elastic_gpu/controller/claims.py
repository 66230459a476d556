"""The claims controller: binder, provisioner trigger, reclaimer and claim-protection finalizer.

Per claim (key `claim:<namespace>/<name>`):
1. a deleted claim (deletionTimestamp) keeps its finalizer while `core.claims.pods.pods_using` lists
   an unfinished pod naming it (Event `WaitingForPods`), then the finalizer is removed;
2. otherwise the finalizer is added first;
3. `core.claims.binding.decide` on the caches; `Bind` writes the ElasticGPU's claimRef and phase Bound,
   then the claim's spec.elasticGPUName, then its status (a crash between any two writes is
   finished by the next reconcile, which decides Bind again); `Provision` asks the extender
   (`POST /provision`), which creates `egpu-<uid>` pre-bound to the claim, and binds it at
   once; `Pending` / `Lost` go to status with an Event.
Per ElasticGPU (key `egpu:<name>`): `core.claims.release.decide_release` once its claim is gone
(confirmed by a live GET, never from a cache alone) and no pod that has not stopped uses its
cards (`core.claims.pods.pods_holding`, from the cache and then a live list of the claim's
namespace; Event `WaitingForPods`): status Released (Retain) or deleted.

Writes happen only when something changes (status compared before patching), carry the
object's resourceVersion (a stale cache gets 409 and a requeue, never a lost update), and
Events are de-duplicated by the recorder. Unschedulable claims are retried with backoff and
at once when capacity may have freed (a GPU pod finished or deleted, an ElasticGPU deleted).

Pre-created ElasticGPUs (not pre-bound to a claim's uid, not bound yet) are checked against
the GPUDevice inventory first (`core.claims.inventory.inventory_problem`: node, card indexes, uuids and
MIG instances): `Available`, or `Failed` with the reason (a claim never binds to it); checked
again whenever a GPUDevice's spec changes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.api import gpudevice
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.provisioning import ProvisionError
from elastic_gpu.core import annotations as ann
from elastic_gpu.core import podlife
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.decisions import Decision, InSync
from elastic_gpu.core.claims.inventory import (
    INVENTORY_REASONS,
    InventoryCard,
    checked_against_inventory,
    inventory_problem,
)
from elastic_gpu.core.claims.model import (
    ClaimPhase,
    ClaimRef,
    ElasticGPUPhase,
    GPUClass,
    LostReason,
    PendingReason,
    provisioned_name,
)
from elastic_gpu.core.claims.pods import CLAIM_PROTECTION_FINALIZER, pods_holding, pods_using
from elastic_gpu.core.claims.release import Keep, MarkReleased, decide_release
from elastic_gpu.kube.client import JSON_PATCH, PODS, Resource
from elastic_gpu.kube.errors import ApiError, Conflict, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING
from elastic_gpu.kube.informer import Handler, Obj, object_key, resource_version
from elastic_gpu.kube.paths import group_prefix
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

PREFIX = group_prefix(api.GROUP, api.VERSION)
CLAIMS = Resource(PREFIX, api.CLAIM_PLURAL, True)
CLASSES = Resource(PREFIX, api.CLASS_PLURAL, False)
EGPUS = Resource(PREFIX, api.EGPU_PLURAL, False)
#: the card inventory the agents publish, that pre-created ElasticGPUs are checked against
DEVICES = Resource(group_prefix(gpudevice.GROUP, gpudevice.VERSION), gpudevice.PLURAL, False)

CLAIM_KEY = "claim:"
EGPU_KEY = "egpu:"
#: how long a claim waits for the watch to show our own last write before reconciling anyway
UNSEEN_WRITE_WAIT_S = 5.0
#: after capacity may have freed, retry Unschedulable claims this soon (the extender's own
#: watch must see the freeing first; further retries back off from the base delay)
CAPACITY_RETRY_S = 0.2


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_claim_names(pod: Mapping[str, Any]) -> set[str]:
    """Claim names a pod's annotations mention (raw values: the safe side for the index)."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return {v for k, v in notes.items()
            if isinstance(k, str) and k.startswith(ann.CLAIM_PREFIX) and isinstance(v, str)}


def _holds_gpu(pod: Mapping[str, Any]) -> bool:
    return ann.ASSIGNMENT in ((pod.get("metadata") or {}).get("annotations") or {}) or \
        bool(_pod_claim_names(pod))


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


class _PhaseCollector(Collector):
    def __init__(self, controller: ClaimController) -> None:
        self.controller = controller

    def collect(self) -> Any:
        yield _by_phase("elasticgpu_claims", "ElasticGPUClaims by phase (cache)",
                        self.controller.claims.items(), ClaimPhase, ClaimPhase.PENDING)
        yield _by_phase("elasticgpu_elasticgpus", "ElasticGPUs by phase (cache)",
                        self.controller.egpus.items(), ElasticGPUPhase,
                        ElasticGPUPhase.PENDING)


def _by_phase(name: str, documentation: str, objects: list[Obj],
              phases: type[ClaimPhase] | type[ElasticGPUPhase],
              unset: ClaimPhase | ElasticGPUPhase) -> GaugeMetricFamily:
    """A gauge of `objects` by `status.phase` (every phase present, 0 if none; an object with
    no phase yet counts as `unset`)."""
    counts = {p.value: 0 for p in phases}
    for obj in objects:
        phase = (obj.get("status") or {}).get("phase") or unset.value
        counts[phase] = counts.get(phase, 0) + 1
    family = GaugeMetricFamily(name, documentation, labels=["phase"])
    for phase, n in sorted(counts.items()):
        family.add_metric([phase], n)
    return family


class ClaimController:
    name = "claims"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.recorder = ctx.recorder
        self.queue: WorkQueue[str] = WorkQueue(ctx.new_backoff())
        f = ctx.informers
        self.claims = f.informer(CLAIMS.path(), "elasticgpuclaims")
        self.classes = f.informer(CLASSES.path(), "elasticgpuclasses")
        self.egpus = f.informer(EGPUS.path(), "elasticgpus")
        self.pods = f.informer(PODS.path(), "pods")
        # (without the GPUDevice CRD there is no inventory: pre-created ElasticGPUs are Failed)
        self.devices = f.informer(DEVICES.path(), "gpudevices", missing_ok=True)
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
        #: the caches' classes and ElasticGPUs decoded once per change (not per reconcile)
        self.decoded_classes: dict[str, GPUClass] = {}
        self.decoded_egpus: dict[str, claim_model.ElasticGPU] = {}
        self.claims.add_handler(Handler(
            on_add=self._claim_changed, on_update=lambda _o, n: self._claim_changed(n),
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
        ctx.metrics.registry.register(_PhaseCollector(self))

    # ------------------------------------------------------------------ event handlers

    def _claim_changed(self, obj: Obj) -> None:
        key = object_key(obj)
        seen = self.unseen_writes.get(key)
        if seen is not None and seen[0] == resource_version(obj):
            del self.unseen_writes[key]  # the cache has caught up with our last write
        self.queue.add(CLAIM_KEY + key)

    def _claim_deleted(self, obj: Obj) -> None:
        key = object_key(obj)
        self.unseen_writes.pop(key, None)
        self.unschedulable.discard(key)
        ns, name = key.split("/", 1)
        for egpu in self.egpus.items():
            ref = (egpu.get("spec") or {}).get("claimRef") or {}
            if (ref.get("namespace"), ref.get("name")) == (ns, name):
                self.queue.add(EGPU_KEY + object_key(egpu))

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
        self._egpu_touched(obj)

    def _egpu_touched(self, obj: Obj) -> None:
        self.queue.add(EGPU_KEY + object_key(obj))
        ref = (obj.get("spec") or {}).get("claimRef") or {}
        if ref.get("namespace") and ref.get("name"):
            self.queue.add(f"{CLAIM_KEY}{ref['namespace']}/{ref['name']}")
        name = (obj.get("metadata") or {}).get("name")
        for claim in self.claims.items():  # claims naming it statically
            if (claim.get("spec") or {}).get("elasticGPUName") == name:
                self.queue.add(CLAIM_KEY + object_key(claim))

    def _egpu_deleted(self, obj: Obj) -> None:
        self.decoded_egpus.pop(object_key(obj), None)
        self._egpu_touched(obj)
        self.capacity_freed()

    def _inventory_changed(self) -> None:
        """The cards may differ: check the pre-created ElasticGPUs again."""
        for key, egpu in self.decoded_egpus.items():
            if checked_against_inventory(egpu):
                self.queue.add(EGPU_KEY + key)

    def _inventory(self) -> dict[str, dict[int, InventoryCard]]:
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

    # ------------------------------------------------------------------ workers

    async def run(self, workers: int) -> None:
        for obj in self.claims.items():  # everything once at start (the informers' adds
            self._claim_changed(obj)     # may predate leadership)
        for obj in self.egpus.items():
            self.queue.add(EGPU_KEY + object_key(obj))
        try:
            await asyncio.gather(*(self._worker() for _ in range(workers)))
        finally:
            self.queue.shutdown()

    async def _worker(self) -> None:
        metrics = self.ctx.metrics
        while True:
            key = await self.queue.get()
            if key is None:
                return
            started = time.perf_counter()
            result = "ok"
            try:
                if key.startswith(CLAIM_KEY):
                    await self.reconcile_claim(key[len(CLAIM_KEY):])
                else:
                    await self.reconcile_egpu(key[len(EGPU_KEY):])
                self.queue.forget(key)
                log.debug("%s reconciled in %.1f ms", key, (time.perf_counter() - started) * 1e3)
            except asyncio.CancelledError:
                raise
            except (Requeue, Conflict, ProvisionError) as err:
                result = "requeue"
                delay = self.queue.add_rate_limited(key)
                log.info("%s: %s; retry in %.3f s", key, err, delay)
            except Exception:
                result = "error"
                delay = self.queue.add_rate_limited(key)
                log.exception("%s: reconcile failed; retry in %.3f s", key, delay)
            finally:
                self.queue.done(key)
                metrics.reconciles.labels(self.name, result).inc()
                metrics.reconcile_seconds.labels(self.name).observe(time.perf_counter() - started)

    # ------------------------------------------------------------------ reading the caches

    def _pods_of(self, key: str) -> list[Obj]:
        return [pod for p in sorted(self.pods_by_claim.get(key, ()))
                if (pod := self.pods.get(p)) is not None]

    # ------------------------------------------------------------------ claims

    def _wrote(self, key: str, obj: Obj) -> Obj:
        """Remember the resourceVersion of a claim we just wrote until the cache shows it."""
        version = resource_version(obj)
        cached = self.claims.get(key)
        if cached is None or resource_version(cached) != version:
            self.unseen_writes[key] = (version, time.monotonic() + UNSEEN_WRITE_WAIT_S)
        return obj

    async def reconcile_claim(self, key: str) -> None:
        obj = self.claims.get(key)
        if obj is None:
            self.unschedulable.discard(key)
            return
        unseen = self.unseen_writes.get(key)
        if unseen is not None:
            wait = unseen[1] - time.monotonic()
            if wait > 0:  # the cache is older than our last write: its watch event requeues
                self.queue.add_after(CLAIM_KEY + key, wait)  # (or, if it never comes, this)
                return
            del self.unseen_writes[key]
        try:
            claim = api.claim_from_object(obj)
        except api.ElasticGPUObjectError as err:
            self.recorder.record(obj, WARNING, "InvalidObject", str(err))
            return
        finalizers: list[str] = list((obj.get("metadata") or {}).get("finalizers") or [])
        if claim.deleting:
            await self._finish_deletion(obj, claim, finalizers)
            return
        egpus: Mapping[str, claim_model.ElasticGPU] = self.decoded_egpus
        decision = decide(claim, self.decoded_classes, egpus)
        if CLAIM_PROTECTION_FINALIZER not in finalizers and \
                not isinstance(decision, claim_decisions.Bind | claim_decisions.Provision):
            # a claim about to be bound gets the finalizer with spec.elasticGPUName (one write)
            obj = self._wrote(key, await self.client.patch(CLAIMS.path(claim.namespace, claim.name), {
                "metadata": {"finalizers": [*finalizers, CLAIM_PROTECTION_FINALIZER],
                             "resourceVersion": obj["metadata"]["resourceVersion"]}}))
        provisioned_on: str | None = None
        if isinstance(decision, claim_decisions.Provision):
            decision, egpus, provisioned_on = await self._provision(obj, claim, egpus)
        if isinstance(decision, claim_decisions.Bind):
            await self._bind(obj, claim, egpus[decision.elastic_gpu], provisioned_on)
            return
        if isinstance(decision, claim_decisions.Pending) and \
                decision.reason is PendingReason.UNSCHEDULABLE:
            self.unschedulable.add(key)
        else:
            self.unschedulable.discard(key)
        if isinstance(decision, claim_decisions.Lost) and \
                decision.reason is LostReason.ELASTICGPU_MISSING and claim.elastic_gpu_name:
            # Lost is final: never from a cache that may just not show the ElasticGPU yet
            try:
                await self.client.get(EGPUS.path(name=claim.elastic_gpu_name))
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
        if isinstance(decision, claim_decisions.Provision):
            raise Requeue(f"claim {key}: provisioning not finished")

    async def _provision(self, obj: Obj, claim: claim_model.Claim, egpus: Mapping[str, claim_model.ElasticGPU]
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
        return decide(claim, self.decoded_classes, egpus), egpus, made_on

    async def _bind(self, obj: Obj, claim: claim_model.Claim, egpu: claim_model.ElasticGPU,
                    provisioned_on: str | None = None) -> None:
        """ElasticGPU first (claimRef with the uid, phase Bound), then the claim's spec, then
        the claim's status: each write skipped when already done. A claim provisioned in this
        reconcile (`provisioned_on`) gets one Event, Provisioned, that says both (a PV's
        ProvisioningSucceeded): one Event write per claim less at claim-creation rates."""
        egpu_obj = self.egpus.get(egpu.name)
        ref = ClaimRef.of(claim)
        if egpu.claim_ref != ref:
            if egpu_obj is None:
                egpu_obj = await self.client.get(EGPUS.path(name=egpu.name))
            egpu_obj = await self.client.patch(EGPUS.path(name=egpu.name), {
                "metadata": {"resourceVersion": egpu_obj["metadata"]["resourceVersion"]},
                "spec": {"claimRef": {"namespace": ref.namespace, "name": ref.name,
                                      "uid": ref.uid}}})
        if egpu_obj is None or \
                (egpu_obj.get("status") or {}).get("phase") != ElasticGPUPhase.BOUND.value:
            # no resourceVersion needed when the cache lacks it (just provisioned): its
            # claimRef, already this claim's, can never point at another claim
            patch: dict[str, Any] = {"status": {"phase": ElasticGPUPhase.BOUND.value,
                                                "reason": "",
                                                "message": f"bound to claim {claim.key}"}}
            if egpu_obj is not None:
                patch["metadata"] = {"resourceVersion": egpu_obj["metadata"]["resourceVersion"]}
            egpu_obj = await self.client.patch(EGPUS.path(name=egpu.name, subresource="status"),
                                               patch)
            if egpu.name != provisioned_name(claim):
                # a static binding is news on the ElasticGPU; a provisioned one was made bound
                # (the claim's Provisioned and Bound events tell it, one Event write less)
                self.recorder.record(egpu_obj, NORMAL, "Bound", f"bound to claim {claim.key}")
        finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
        if claim.elastic_gpu_name != egpu.name or CLAIM_PROTECTION_FINALIZER not in finalizers:
            meta: dict[str, Any] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            if CLAIM_PROTECTION_FINALIZER not in finalizers:
                meta["finalizers"] = [*finalizers, CLAIM_PROTECTION_FINALIZER]
            obj = self._wrote(claim.key, await self.client.patch(
                CLAIMS.path(claim.namespace, claim.name),
                {"metadata": meta, "spec": {"elasticGPUName": egpu.name}}))
        self.unschedulable.discard(claim.key)
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

    async def _write_status(self, obj: Obj, decision: Decision,
                            egpu: claim_model.ElasticGPU | None) -> bool:
        """Patch the claim's status if it differs from what the decision gives; True if so."""
        status = api.claim_status(decision, obj, _now(), egpu)
        current = obj.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return False
        meta = obj["metadata"]
        self._wrote(f"{meta['namespace']}/{meta['name']}", await self.client.patch(
            CLAIMS.path(meta["namespace"], meta["name"], "status"),
            {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}))
        return True

    async def _finish_deletion(self, obj: Obj, claim: claim_model.Claim, finalizers: list[str]) -> None:
        if CLAIM_PROTECTION_FINALIZER not in finalizers:
            return
        using = pods_using(claim, self._pods_of(claim.key))
        if using:
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

    # ------------------------------------------------------------------ ElasticGPUs

    async def _check_inventory(self, obj: Obj, egpu: claim_model.ElasticGPU) -> None:
        """A pre-created ElasticGPU names real cards (`Available`) or says why not (`Failed`,
        reason and message); written only when that changes. A `Failed` one set by anyone
        for another reason is left so."""
        status = obj.get("status") or {}
        if egpu.phase is ElasticGPUPhase.FAILED and \
                status.get("reason") not in INVENTORY_REASONS:
            return
        problem = inventory_problem(egpu, self._inventory())
        if problem is None:
            want: dict[str, Any] = {"phase": ElasticGPUPhase.AVAILABLE.value,
                                    "reason": None, "message": None}
        else:
            want = {"phase": ElasticGPUPhase.FAILED.value, "reason": problem[0].value,
                    "message": problem[1]}
        if all(status.get(k) == v for k, v in want.items()):
            return
        name = str(obj["metadata"]["name"])
        await self.client.patch(EGPUS.path(name=name, subresource="status"), {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": want})
        if problem is not None:
            log.warning("%s", problem[1])
            self.recorder.record(obj, WARNING, problem[0].value, problem[1])
        elif egpu.phase is ElasticGPUPhase.FAILED:
            self.recorder.record(obj, NORMAL, "Available",
                                 "its node, cards and uuids are in the inventory now")

    async def reconcile_egpu(self, name: str) -> None:
        obj = self.egpus.get(name)
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
        decision = decide_release(egpu, claim, pods_holding(egpu, self.pods.items()))
        if isinstance(decision, Keep):
            self._keep(obj, name, decision)
            return
        # the caches say the claim is gone and no pod uses the cards: make sure with the API
        # (the claim, and the pods of its namespace) before releasing anything
        if claim is None and self.claims.get(f"{ref.namespace}/{ref.name}") is None:
            claim = await self._live_claim(ref)
        pods, _ = await self.client.list(PODS.path(ref.namespace))
        decision = decide_release(egpu, claim, pods_holding(egpu, pods))
        if isinstance(decision, Keep):
            self._keep(obj, name, decision)
            return
        if isinstance(decision, MarkReleased):
            await self.client.patch(EGPUS.path(name=name, subresource="status"), {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": {"phase": ElasticGPUPhase.RELEASED.value,
                           "reason": "ClaimDeleted", "message": decision.message}})
            self.recorder.record(obj, NORMAL, "Released", decision.message)
            return
        try:
            await self.client.delete(EGPUS.path(name=name), uid=obj["metadata"].get("uid"),
                                     resource_version=obj["metadata"].get("resourceVersion"))
        except NotFound:
            return
        self.recorder.record(obj, NORMAL, "Deleted", f"{decision.message}; reclaim policy "
                             "Delete: the ElasticGPU and its cards are freed")

    def _keep(self, obj: Obj, name: str, decision: Keep) -> None:
        """A kept ElasticGPU whose claim is gone waits for the pods still using its cards:
        each one's stop or deletion brings it back (`_pod_stopped`)."""
        if not decision.waiting_for:
            return
        for pod in decision.waiting_for:
            self.egpus_held_by.setdefault(pod, set()).add(name)
        self.recorder.record(obj, NORMAL, "WaitingForPods",
                             "its claim is gone; release waits for the pods using its cards: "
                             + ", ".join(decision.waiting_for))

    async def _claim_of(self, ref: ClaimRef) -> claim_model.Claim | None:
        obj = self.claims.get(f"{ref.namespace}/{ref.name}")
        if obj is None:
            return None
        try:
            return api.claim_from_object(obj)
        except api.ElasticGPUObjectError:
            return None

    async def _live_claim(self, ref: ClaimRef) -> claim_model.Claim | None:
        try:
            return api.claim_from_object(await self.client.get(CLAIMS.path(ref.namespace,
                                                                           ref.name)))
        except NotFound:
            return None
        except api.ElasticGPUObjectError:
            return None
