"""The budget keeper's adapter (controller/budget.py) against a recording fake of the API: the
status write comes before the finalizer removal, a failed status write removes no finalizer,
writes are rate-limited, a namespace without a budget keeps no finalizer, and the
cluster default creates a GPUBudget."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Mapping
from typing import Any

import pytest

from elastic_gpu.controller.budget import BudgetKeeper
from elastic_gpu.controller.config import BudgetsConfig, ControllerConfig
from elastic_gpu.controller.manager import Context, InformerFactory, Metrics
from elastic_gpu.core.budget.settle import FINALIZER
from elastic_gpu.kube.errors import Conflict


def ts(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeApi:
    """Records calls; `fail_status` makes status writes answer 409."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_status = False
        self.version = 100

    async def update(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        if self.fail_status:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.calls.append(("update", path, obj))
        self.version += 1
        out = dict(obj)
        out["metadata"] = {**obj["metadata"], "resourceVersion": str(self.version)}
        return out

    async def patch(self, path: str, patch: Any, content_type: str = "") -> dict[str, Any]:
        self.calls.append(("patch", path, patch))
        return {}

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", path, obj))
        return dict(obj)


def keeper(api: FakeApi, **settings: Any) -> BudgetKeeper:
    ctx = Context(api, InformerFactory(api), None, Metrics(), None, "me",  # type: ignore[arg-type]
                  config=ControllerConfig(budgets=BudgetsConfig(**settings)))
    return BudgetKeeper(ctx)


NOW = int(time.time())


def pod(name: str, *, ended: bool, finalizer: bool = True, ns: str = "team") -> dict[str, Any]:
    state = ({"terminated": {"startedAt": ts(NOW - 100), "finishedAt": ts(NOW - 40)}}
             if ended else {"running": {"startedAt": ts(NOW - 100)}})
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "resourceVersion": "7", "finalizers": [FINALIZER] if finalizer else []},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"tencent.com/vcuda-core": "50"}}}]},
            "status": {"phase": "Succeeded" if ended else "Running",
                       "containerStatuses": [{"name": "main", "state": state}]}}


BUDGET = {"apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
          "metadata": {"name": "b", "namespace": "team", "uid": "b1", "resourceVersion": "5",
                       "creationTimestamp": ts(NOW - 1000)},
          "spec": {"gpuHours": 1, "period": "24h"}}


def test_status_is_written_before_the_finalizer_goes_and_counts_the_pod_once() -> None:
    api = FakeApi()
    k = keeper(api)
    k.budgets.apply("ADDED", BUDGET)
    k.pods.apply("ADDED", pod("done", ended=True))
    k.pods.apply("ADDED", pod("run", ended=False))
    asyncio.run(k.reconcile("team"))
    kinds = [(c[0], c[1].rsplit("/", 1)[-1]) for c in api.calls]
    assert kinds == [("update", "status"), ("patch", "done")], kinds
    status = api.calls[0][2]["status"]
    assert status["settled"]["uids"] == ["uid-done"]
    assert status["settled"]["gpuSeconds"] == "30"  # 60 s at half a card
    assert api.calls[1][2]["metadata"]["finalizers"] is None
    assert api.calls[1][2]["metadata"]["resourceVersion"] == "7"  # a precondition


def test_a_failed_status_write_removes_no_finalizer() -> None:
    api = FakeApi()
    api.fail_status = True
    k = keeper(api)
    k.budgets.apply("ADDED", BUDGET)
    k.pods.apply("ADDED", pod("done", ended=True))
    with pytest.raises(Conflict):
        asyncio.run(k.reconcile("team"))
    assert not any(c[0] == "patch" for c in api.calls)


def test_writes_are_rate_limited_and_unchanged_status_is_not_rewritten() -> None:
    api = FakeApi()
    k = keeper(api, min_write_s=60.0)
    k.budgets.apply("ADDED", BUDGET)
    k.pods.apply("ADDED", pod("run", ended=False))
    asyncio.run(k.reconcile("team"))
    assert [c[0] for c in api.calls] == ["update"]
    k.pods.apply("MODIFIED", pod("run", ended=True))  # must be settled: a write is due
    delay = asyncio.run(k.reconcile("team"))
    assert [c[0] for c in api.calls] == ["update"], "at most one write per min_write_s"
    assert delay is not None and 0 < delay <= 60


def test_without_a_budget_no_pod_keeps_the_finalizer() -> None:
    """Issue #26: nothing to settle, so a stale finalizer (given before the GPUBudget was
    deleted, or by an older webhook) goes from running pods too: it would hold a deleted pod
    while egpu controller is down."""
    api = FakeApi()
    k = keeper(api)
    k.pods.apply("ADDED", pod("done", ended=True))
    k.pods.apply("ADDED", pod("run", ended=False))
    k.pods.apply("ADDED", pod("free", ended=False, finalizer=False))
    asyncio.run(k.reconcile("team"))
    assert sorted((c[0], c[1].rsplit("/", 1)[-1]) for c in api.calls) == [
        ("patch", "done"), ("patch", "run")]


def test_the_cluster_default_creates_a_gpubudget_where_gpu_pods_run() -> None:
    api = FakeApi()
    k = keeper(api, default_gpu_hours=2.5, default_period="1h")
    k.pods.apply("ADDED", pod("run", ended=False))
    asyncio.run(k.reconcile("team"))
    ((verb, path, body),) = api.calls
    assert verb == "create" and path.endswith("/namespaces/team/gpubudgets")
    assert body["metadata"]["name"] == "default"
    assert body["spec"] == {"gpuHours": 2.5, "period": "1h"}
