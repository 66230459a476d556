"""The budget keeper: every namespace's GPU-time ledger, settled durably into its GPUBudget.

Per namespace (key = the namespace's name), from the shared pod informer and a GPUBudget
informer (the CRD may be missing: then there are no budgets):

1. every GPU pod's observations are folded into the ledger (`core.budget.ledger.observe` /
   `merge`, keyed per pod UID; usage is computed from the pods' own timestamps, never accumulated);
2. the GPUBudget (the first by name in the namespace; with `--budget-default-gpu-hours`, the
   keeper creates `default` where a namespace runs GPU pods and has none) is read, its
   durable `status.settled` rolled to the current period, every ended pod settled into it and
   the UIDs of pods gone from the API forgotten (`core.budget.plan.plan_namespace`);
3. the status (used, remaining, period, `OverBudget`, `settled`) is written, only when it
   differs from the object's (an equal one is skipped), with the object's
   resourceVersion as precondition (a stale cache gets 409 and a retry, never a lost or
   doubled settle) when the settled part changed, the over-budget decision or the period
   changed, or `refresh_s` passed while usage moved; at most one write per namespace every
   `min_write_s`;
4. only then the finalizer `elasticgpu.io/budget` of the settled pods is removed (a keeper
   killed between 3 and 4 finds the UID settled and only removes the finalizer).

The finalizer is added by the webhook at CREATE (`egpu webhook --budget-finalizer`), so a pod
that starts and ends while the keeper is down is held until it is settled; the keeper adds it
to a running GPU pod of a budgeted namespace that lacks it (admitted without the webhook),
which covers that pod from then on. Pods of a namespace without a budget get none from the
webhook, and the keeper removes any they have (stale: nothing to settle there). A GPU pod
that disappears without the finalizer (never had it) is settled from its last observation when
the keeper sees it go (best effort: missed if the keeper was down).

The namespace is looked at again without any API change at its period's end (the refill), when
its running pods will have spent the rest of the budget (the over-budget flip) and every
`refresh_s` while pods run. See docs/budgets.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from elastic_gpu.api import budget as api
from elastic_gpu.api.elasticgpu import GROUP, VERSION
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.worker import Done, Outcome, work
from elastic_gpu.core.budget.allowance import Budget, BudgetState
from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.ledger import PodRecord, merge, observe, replace_runs
from elastic_gpu.core.budget.plan import NamespacePlan, next_check, plan_namespace
from elastic_gpu.core.budget.settle import FINALIZER, ended
from elastic_gpu.core.budget.usage import burn_rate
from elastic_gpu.core.dra.pods import claim_names
from elastic_gpu.kube.errors import AlreadyExists, ApiError, Conflict, Invalid, NotFound
from elastic_gpu.kube.informer import Handler, Obj, object_key
from elastic_gpu.kube.resources import BUDGETS, PODS, RESOURCE_CLAIMS
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

#: a finalizer removal that met a newer pod (409) is retried this soon
RETRY_S = 0.5
#: the label of the GPUBudgets the keeper creates from the cluster default
DEFAULT_LABEL = "elasticgpu.io/budget-default"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    return [str(f) for f in _meta(obj).get("finalizers") or []]


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int(str(_meta(obj).get("resourceVersion") or "0"))
    except ValueError:
        return 0


class BudgetMetrics:
    def __init__(self, ctx: Context) -> None:
        registry = ctx.metrics.registry
        self.used = Gauge("elasticgpu_budget_used_gpu_seconds",
                          "GPU-seconds (card-seconds) used by the namespace in its current "
                          "period (decayed, with halfLife)", ["namespace"], registry=registry)
        self.allowed = Gauge("elasticgpu_budget_allowed_gpu_seconds",
                             "GPU-seconds the namespace's budget allows per period",
                             ["namespace"], registry=registry)
        self.remaining = Gauge("elasticgpu_budget_remaining_gpu_seconds",
                               "GPU-seconds left in the namespace's current period",
                               ["namespace"], registry=registry)
        self.over = Gauge("elasticgpu_budget_over_budget",
                          "1 while the namespace is over budget (new GPU pods get the lower "
                          "PriorityClass)", ["namespace"], registry=registry)
        self.settled = Counter("elasticgpu_budget_settled_pods",
                               "Ended GPU pods whose usage was settled into their GPUBudget",
                               ["namespace"], registry=registry)
        self.writes = Counter("elasticgpu_budget_status_writes",
                              "GPUBudget status writes by result (ok, conflict, error; unchanged: not "
                              "written, the object already said it)",
                              ["result"], registry=registry)
        self.settle_delay = Histogram(
            "elasticgpu_budget_settle_delay_seconds",
            "From a pod's end (its last finishedAt or deletionTimestamp) to its finalizer "
            "removed", registry=registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.held = Gauge("elasticgpu_budget_pods_held",
                          "Ended GPU pods whose finalizer waits for their settling",
                          registry=registry)


class BudgetKeeper:
    name = "budgets"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.settings = ctx.budget
        self.queue: WorkQueue[str] = WorkQueue(ctx.new_backoff())
        self.pods = ctx.informers.informer(PODS.path(), "pods")
        self.budgets = ctx.informers.informer(BUDGETS.path(), "gpubudgets", missing_ok=True)
        #: DRA claims: a pod's containers may hold this driver's devices through them (an
        #: empty collection where the cluster serves no resource.k8s.io/v1)
        self.claims = ctx.informers.informer(RESOURCE_CLAIMS.path(), "resourceclaims",
                                             missing_ok=True)
        #: namespace -> its ResourceClaims by name
        self.ns_claims: dict[str, dict[str, Obj]] = {}
        #: pod UID -> record (GPU pods only)
        self.ledger: dict[str, PodRecord] = {}
        #: the same records by namespace (a reconcile reads its namespace's only)
        self.by_ns: dict[str, dict[str, PodRecord]] = {}
        #: namespace -> its pods (the informer's objects, by key)
        self.ns_pods: dict[str, dict[str, Obj]] = {}
        #: pod UID -> "namespace/name" while it is in the API
        self.keys: dict[str, str] = {}
        #: UIDs of pods gone from the API that are kept in the ledger until they are settled
        self.gone: set[str] = set()
        #: namespace -> the GPUBudget our last status write returned (newer than a lagging
        #: cache; resourceVersions compared as etcd's integers)
        self.latest: dict[str, Obj] = {}
        #: namespace -> (monotonic time of the last write, over, period start, used)
        self.written: dict[str, tuple[float, bool, int, Fraction]] = {}
        self.metrics = BudgetMetrics(ctx)
        self.metrics.held.set_function(self._held)  # computed when scraped
        self.pods.add_handler(Handler(on_add=self._pod_seen,
                                      on_update=lambda _o, n: self._pod_seen(n),
                                      on_delete=self._pod_gone))
        self.budgets.add_handler(Handler(on_add=self._budget_changed,
                                         on_update=lambda _o, n: self._budget_changed(n),
                                         on_delete=self._budget_changed))
        self.claims.add_handler(Handler(on_add=self._claim_seen,
                                        on_update=lambda _o, n: self._claim_seen(n),
                                        on_delete=self._claim_gone))

    # ------------------------------------------------------------------ event handlers

    def _observe(self, pod: Obj) -> PodRecord | None:
        try:
            return observe(pod, self.ns_claims.get(str(_meta(pod).get("namespace") or "")))
        except BudgetError as err:
            log.warning("pod %s: not counted: %s", object_key(pod), err)
            return None

    def _pod_seen(self, pod: Obj) -> None:
        record = self._observe(pod)
        ns = str(_meta(pod).get("namespace") or "")
        self.ns_pods.setdefault(ns, {})[object_key(pod)] = pod
        if record is not None:
            known = self.ledger.get(record.uid)
            self._put(record if known is None else merge(known, record))
            self.keys[record.uid] = object_key(pod)
            self.queue.add(ns)
        elif FINALIZER in _finalizers(pod):
            self.queue.add(ns)  # unreadable but held: released when it ends

    def _pod_gone(self, pod: Obj) -> None:
        uid = str(_meta(pod).get("uid") or "")
        self.keys.pop(uid, None)
        ns = str(_meta(pod).get("namespace") or "")
        mine = self.ns_pods.get(ns, {})
        mine.pop(object_key(pod), None)
        if not mine:
            self.ns_pods.pop(ns, None)
        known = self.ledger.get(uid)
        if known is None:
            return
        record = self._observe(pod)
        merged = known if record is None else merge(known, record)
        now = int(time.time())
        # gone: it runs no more; no run of it lasts past now
        merged = replace_runs(
            PodRecord(merged.uid, merged.namespace, merged.containers, True,
                           merged.deleted_at),
            lambda runs: {s: max(s, min(now, now if e is None else e)) for s, e in runs.items()})
        self._put(merged)
        self.gone.add(uid)
        self.queue.add(merged.namespace)

    def _put(self, record: PodRecord) -> None:
        self.ledger[record.uid] = record
        self.by_ns.setdefault(record.namespace, {})[record.uid] = record

    def _drop(self, uid: str) -> None:
        """A gone pod's record, once settled, leaves the ledger."""
        self.gone.discard(uid)
        record = self.ledger.pop(uid, None)
        if record is not None:
            mine = self.by_ns.get(record.namespace, {})
            mine.pop(uid, None)
            if not mine:
                self.by_ns.pop(record.namespace, None)

    def _held(self) -> float:
        return float(sum(1 for r in self.ledger.values() if r.final and r.uid in self.keys))

    def _claim_seen(self, claim: Obj) -> None:
        ns, name = str(_meta(claim).get("namespace") or ""), str(_meta(claim).get("name") or "")
        self.ns_claims.setdefault(ns, {})[name] = claim
        # its pods' records take its allocation (records keep the largest share seen, so a
        # claim released at the pod's end takes nothing back from the time it ran)
        for pod in list(self.ns_pods.get(ns, {}).values()):
            if name in claim_names(pod).values():
                self._pod_seen(pod)

    def _claim_gone(self, claim: Obj) -> None:
        ns, name = str(_meta(claim).get("namespace") or ""), str(_meta(claim).get("name") or "")
        mine = self.ns_claims.get(ns, {})
        mine.pop(name, None)
        if not mine:
            self.ns_claims.pop(ns, None)

    def _budget_changed(self, obj: Obj) -> None:
        self.queue.add(str(_meta(obj).get("namespace") or ""))

    # ------------------------------------------------------------------ reconcile

    async def run(self, workers: int) -> None:
        import asyncio

        for ns in set(self.ns_pods) | {str(_meta(b).get("namespace") or "")
                                       for b in self.budgets.items()}:
            self.queue.add(ns)
        try:
            await asyncio.gather(*(self._worker() for _ in range(workers)))
        finally:
            self.queue.shutdown()

    async def _worker(self) -> None:
        await work(self.queue, self.name, self.ctx.metrics, self._reconcile_key,
                   expected=(Conflict, NotFound, Invalid), describe=lambda ns: f"budget {ns}")

    async def _reconcile_key(self, ns: str) -> Outcome:
        return Done(after=await self.reconcile(ns))

    def _budget_object(self, ns: str) -> Obj | None:
        mine = sorted((b for b in self.budgets.items() if _meta(b).get("namespace") == ns),
                      key=lambda b: str(_meta(b).get("name")))
        if not mine:
            self.latest.pop(ns, None)
            return None
        obj = mine[0]
        ours = self.latest.get(ns)
        if ours is not None and _meta(ours).get("uid") == _meta(obj).get("uid") and \
                _rv(ours) > _rv(obj):
            return ours
        return obj

    def _pods_of(self, ns: str) -> list[Obj]:
        return list(self.ns_pods.get(ns, {}).values())

    async def reconcile(self, ns: str) -> float | None:
        """One namespace; returns the delay before it must be looked at again (None: only
        when something changes)."""
        now = int(time.time())
        pods = self._pods_of(ns)
        obj = self._budget_object(ns)
        if obj is None and self.settings.default_gpu_hours is not None and \
                self.by_ns.get(ns):
            await self._create_default(ns)
            return None  # its watch event brings it back here
        if obj is None:
            await self._release_unbudgeted(ns, pods, now)
            self._forget_metrics(ns)
            return None
        try:
            budget = api.budget_from_object(obj)
            stored = api.settled_from_status(obj, budget)
        except api.BudgetObjectError as err:
            log.warning("%s; its namespace is not accounted until it is fixed", err)
            return None
        present = [str(_meta(p).get("uid")) for p in pods]
        ledger = self.by_ns.get(ns, {})
        plan = plan_namespace(budget, stored, ledger, ns, present, now)
        mono = time.monotonic()
        last = self.written.get(ns)
        used = Fraction(plan.state.used)
        due = (plan.changed or last is None or last[1] != plan.state.over
               or last[2] != plan.state.period_start
               or (mono - last[0] >= self.settings.refresh_s and last[3] != used)
               or (obj.get("status") or {}).get("periodStart") is None)
        wait: float | None = None
        if due and last is not None and mono - last[0] < self.settings.min_write_s:
            wait = self.settings.min_write_s - (mono - last[0])
            due = False
        if due:
            await self._write_status(ns, obj, budget, plan, now)
            self.written[ns] = (time.monotonic(), plan.state.over, plan.state.period_start, used)
        self._export(ns, budget, plan.state)
        # the finalizers go only for pods the status durably holds as settled
        durable = plan.settled if due else stored
        if not await self._release(pods, durable.uids, now):
            wait = RETRY_S if wait is None else min(wait, RETRY_S)
        await self._hold(pods)
        if due:  # gone pods the write settled leave the ledger (settling them again would
            for uid in [u for u in self.gone if u in ledger  # count them twice)
                        and ended(ledger[u], now)]:
                self._drop(uid)
        rate = burn_rate(self.by_ns.get(ns, {}), ns)
        at = next_check(budget, plan.state, rate, now, self.settings.refresh_s)
        delay = float(at - time.time())
        return min(delay, wait) if wait is not None else delay

    def _forget_metrics(self, ns: str) -> None:
        for gauge in (self.metrics.used, self.metrics.allowed, self.metrics.remaining,
                      self.metrics.over):
            with contextlib.suppress(KeyError):
                gauge.remove(ns)

    def _export(self, ns: str, budget: Budget, state: BudgetState) -> None:
        self.metrics.used.labels(ns).set(float(state.used))
        self.metrics.allowed.labels(ns).set(budget.gpu_seconds)
        self.metrics.remaining.labels(ns).set(float(state.remaining))
        self.metrics.over.labels(ns).set(1 if state.over else 0)

    async def _write_status(self, ns: str, obj: Obj, budget: Budget,
                            plan: NamespacePlan, now: int) -> None:
        body = dict(obj)
        body["status"] = api.budget_status(obj, budget, plan.state, plan.settled, now)
        if not api.status_changed(obj, body["status"]):
            # what the object says already (a restart, a period with nothing new): a write
            # would only bump the resourceVersion and wake every watcher
            self.metrics.writes.labels("unchanged").inc()
            return
        meta = _meta(obj)
        try:
            written = await self.client.update(
                BUDGETS.path(ns, str(meta.get("name")), "status"), body)
        except Conflict:
            self.metrics.writes.labels("conflict").inc()
            self.latest.pop(ns, None)
            raise
        except ApiError:
            self.metrics.writes.labels("error").inc()
            raise
        self.metrics.writes.labels("ok").inc()
        self.latest[ns] = written
        fresh = plan.settled.uids - api.settled_from_status(obj, budget).uids
        if fresh:
            self.metrics.settled.labels(ns).inc(len(fresh))

    async def _release(self, pods: list[Obj], settled: frozenset[str], now: int) -> bool:
        """Remove the finalizer of the settled pods; False when one must be retried."""
        done = True
        for pod in pods:
            uid = str(_meta(pod).get("uid"))
            if uid in settled and FINALIZER in _finalizers(pod):
                done = await self._drop_finalizer(pod, now) and done
        return done

    async def _release_unbudgeted(self, ns: str, pods: list[Obj], now: int) -> None:
        """No budget: nothing to record, so no pod of the namespace keeps the finalizer, ended
        or running (one given before its GPUBudget was deleted, or by an older webhook): a
        stale finalizer would hold a deleted pod while `egpu controller` is down (issue #26).
        A GPUBudget created later gives its running pods the finalizer again (`_hold`)."""
        for pod in pods:
            if FINALIZER in _finalizers(pod):
                await self._drop_finalizer(pod, now)  # a conflict: the next event retries
        for uid in [u for u in self.gone if u in self.by_ns.get(ns, {})]:
            self._drop(uid)

    async def _drop_finalizer(self, pod: Obj, now: int) -> bool:
        """False when the pod changed since the cache saw it (409): retry with the newer."""
        meta = _meta(pod)
        rest = [f for f in _finalizers(pod) if f != FINALIZER]
        try:
            await self.client.patch(
                PODS.path(str(meta.get("namespace")), str(meta.get("name"))),
                {"metadata": {"finalizers": rest or None,
                              "resourceVersion": meta.get("resourceVersion")}})
        except NotFound:
            return True
        except Conflict:
            return False
        record = self.ledger.get(str(meta.get("uid")))
        if record is not None:
            ends = [stop for c in record.containers.values() for e in c.runs.values()
                    if (stop := record.stop(e)) is not None]
            if ends:
                self.metrics.settle_delay.observe(max(0.0, time.time() - max(ends)))
        return True

    async def _hold(self, pods: list[Obj]) -> None:
        """A running GPU pod of a budgeted namespace without the finalizer gets it."""
        for pod in pods:
            meta = _meta(pod)
            uid = str(meta.get("uid"))
            record = self.ledger.get(uid)
            if record is None or record.final or FINALIZER in _finalizers(pod) or \
                    meta.get("deletionTimestamp"):
                continue
            try:
                await self.client.patch(
                    PODS.path(str(meta.get("namespace")), str(meta.get("name"))),
                    {"metadata": {"finalizers": [*_finalizers(pod), FINALIZER],
                                  "resourceVersion": meta.get("resourceVersion")}})
            except (NotFound, Conflict):
                continue  # gone, or changed: its next event brings it back

    async def _create_default(self, ns: str) -> None:
        hours = self.settings.default_gpu_hours
        assert hours is not None
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": api.KIND,
                "metadata": {"name": self.settings.default_name, "namespace": ns,
                             "labels": {DEFAULT_LABEL: "true"}},
                "spec": {"gpuHours": hours if not math.isclose(hours, round(hours))
                         else round(hours), "period": self.settings.default_period}}
        try:
            await self.client.create(BUDGETS.path(ns), body)
            log.info("namespace %s: created GPUBudget %s from the cluster default (%s GPU-hours "
                     "per %s)", ns, self.settings.default_name, hours,
                     self.settings.default_period)
        except AlreadyExists:
            pass
