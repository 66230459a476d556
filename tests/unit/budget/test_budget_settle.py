"""Lossless end-of-pod accounting (core.budget: settle, forget, namespace_used): a model of the
API (pods held by the budget finalizer, the GPUBudget status) and a keeper killed at any
instant, checked against an independent recomputation from the pods' own timestamps."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_testing.budget_ledger import fold_all
from elastic_gpu.core.budget.allowance import Budget
from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.ledger import observe
from elastic_gpu.core.budget.settle import Settled, ended, forget, namespace_used, roll, settle

T0 = 1_800_000_000


def ts(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Pod:
    uid: str
    ns: str
    percent: int
    start: int
    end: int
    delete_at: int | None
    finalizer: bool = True

    @property
    def stop(self) -> int:
        return self.end if self.delete_at is None else min(self.end, self.delete_at)

    def true_usage(self, now: int) -> Fraction:
        return Fraction(self.percent, 100) * max(0, min(self.stop, now) - self.start)

    def manifest(self, t: int) -> dict[str, Any]:
        statuses: list[dict[str, Any]] = []
        phase = "Pending" if t < self.start else "Running" if t < self.stop else "Succeeded"
        if self.start <= t < self.stop:
            statuses = [{"name": "main", "state": {"running": {"startedAt": ts(T0 + self.start)}}}]
        elif t >= self.stop and self.stop > self.start:
            statuses = [{"name": "main", "state": {"terminated": {
                "startedAt": ts(T0 + self.start), "finishedAt": ts(T0 + self.stop)}}}]
        meta: dict[str, Any] = {"uid": self.uid, "namespace": self.ns, "name": self.uid}
        if self.delete_at is not None and t >= self.delete_at:
            meta["deletionTimestamp"] = ts(T0 + self.delete_at)
        return {"metadata": meta, "spec": {"containers": [{"name": "main", "resources": {
            "limits": {"tencent.com/vcuda-core": str(self.percent)}}}]},
            "status": {"phase": phase, "containerStatuses": statuses}}


def run(pods: list[Pod], horizon: int, down: set[int], crash_after_write: set[int],
        finalizers: bool = True) -> None:
    budget = Budget(gpu_seconds=10**9, period_s=10**6, anchor=T0)
    created: dict[str, int] = {p.uid: p.start - 1 for p in pods}
    api: dict[str, Pod] = {}  # what the API holds
    status: dict[str, Settled] = {}  # GPUBudget status per namespace (durable)
    for t in range(horizon):
        now = T0 + t
        for p in pods:  # users create and delete; the API drops a deleted pod without finalizer
            if created[p.uid] == t:
                api[p.uid] = p
                p.finalizer = finalizers
            if p.delete_at == t and p.uid in api and not p.finalizer:
                del api[p.uid]
        if t in down:
            continue
        # a (re)started keeper: its ledger is rebuilt from what the API holds now
        ledger = fold_all(observe(p.manifest(t)) for p in api.values())
        for ns in {p.ns for p in pods}:  # UIDs of pods that are gone are forgotten
            status[ns] = forget(status.get(ns, Settled(T0)), set(status.get(
                ns, Settled(T0)).uids) - set(api))
        crashed = False
        for uid, record in sorted(ledger.items()):
            if not ended(record, now) or uid not in api:
                continue
            pod = api[uid]
            if not pod.finalizer:
                continue
            status[record.namespace] = settle(status.get(record.namespace, Settled(T0)),
                                                record, budget, now)  # write 1: status
            if t in crash_after_write:
                crashed = True  # SIGKILL before the finalizer is removed
                break
            pod.finalizer = False  # write 2: the finalizer removed
            if pod.delete_at is not None and t >= pod.delete_at:
                del api[uid]
        if crashed:
            continue
        ledger = fold_all(observe(p.manifest(t)) for p in api.values())
        for ns in {p.ns for p in pods}:
            used = namespace_used(status.get(ns, Settled(T0)), ledger, ns, budget, now)
            truth = sum((p.true_usage(t) for p in pods if p.ns == ns and created[p.uid] <= t),
                        Fraction(0))
            assert used == truth, (t, ns, used, truth)


POD = st.builds(
    lambda i, ns, pct, start, dur, delete: Pod(f"u{i}", ns, pct, start, start + dur,
                                               None if delete is None else start + delete),
    st.integers(0, 10**6), st.sampled_from(["a", "b"]), st.sampled_from([10, 50, 100]),
    st.integers(1, 30), st.integers(0, 20), st.one_of(st.none(), st.integers(0, 30)))


@settings(max_examples=150, deadline=None)
@given(st.lists(POD, min_size=1, max_size=8, unique_by=lambda p: p.uid),
       st.sets(st.integers(0, 60)), st.sets(st.integers(0, 60)))
def test_killed_at_any_instant_nothing_is_lost_or_counted_twice(
        pods: list[Pod], down: set[int], crash: set[int]) -> None:
    horizon = 70  # every pod has ended and been deleted (if it is) by then; 61-69 the keeper is up
    run(pods, horizon, down, crash)


def test_without_the_finalizer_a_pod_deleted_while_the_keeper_is_down_is_lost() -> None:
    """The model has teeth: without the finalizer the usage of a pod that ends and is deleted
    while the keeper is down is gone from the API and from the recorded usage."""
    pods = [Pod("u1", "a", 50, start=2, end=6, delete_at=7)]
    run(pods, 12, down=set(), crash_after_write=set(), finalizers=True)
    with pytest.raises(AssertionError):
        run([Pod("u1", "a", 50, start=2, end=6, delete_at=7)], 12, down=set(range(3, 9)),
            crash_after_write=set(), finalizers=False)


def test_settling_twice_is_a_no_op_and_an_unended_pod_is_refused() -> None:
    budget = Budget(10**6, 3600, T0)
    done = observe(Pod("u", "a", 50, 0, 10, None).manifest(20))
    live = observe(Pod("v", "a", 50, 0, 10, None).manifest(5))
    assert done is not None and live is not None
    once = settle(Settled(T0), done, budget, T0 + 20)
    assert once.gpu_seconds == 5 and settle(once, done, budget, T0 + 30) == once
    with pytest.raises(BudgetError, match="has not ended"):
        settle(once, live, budget, T0 + 30)
    # a pod not started yet is not ended (no runs, but not final either)
    pending = observe(Pod("w", "a", 50, 5, 10, None).manifest(1))
    assert pending is not None and not ended(pending, T0 + 1)
    # a new period starts empty
    assert roll(once, budget, T0 + 3600) == Settled(T0 + 3600)
