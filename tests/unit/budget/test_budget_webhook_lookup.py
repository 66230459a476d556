"""The webhook's budget half: the finalizer mutator, the over-budget lookup fed to `admit`, and
the lookup's fail-open behaviour (webhook.budgets)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from egpu_testing.webhook_answers import answered
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import MUTATORS
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.mutators.budget import budget_finalizer
from elastic_gpu.core.budget.priority import NamespaceBudget, PriorityDowngrade
from elastic_gpu.core.budget.settle import FINALIZER
from elastic_gpu.webhook.budgets import BudgetLookup, budget_facts
from elastic_gpu.webhook.review import Admission
from elastic_gpu.webhook.sources import Lookups

FACTS = ClusterFacts(largest_cards=8, largest_cards_node="n1")
WITH_FINALIZER = (*MUTATORS, budget_finalizer)


def pod(limits: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", **meta}, "spec": {"containers": [
        {"name": "main", "resources": {"limits": limits}}]}}


def review(obj: Any) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "namespace": "team", "operation": "CREATE",
                                   "object": obj}}).encode()


def patch_of(payload: bytes) -> list[dict[str, Any]]:
    response = json.loads(payload)["response"]
    assert response["allowed"], response
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


def test_gpu_pods_of_budgeted_namespaces_get_the_finalizer_once_cpu_pods_none() -> None:
    gpu = admit(pod({"tencent.com/vcuda-core": "50"}), FACTS, mutate=True,
                mutators=WITH_FINALIZER, budgeted=True)
    assert {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]} in gpu.patch
    other = admit(pod({"tencent.com/vcuda-core": "50"}, finalizers=["x"]), FACTS, mutate=True,
                  mutators=WITH_FINALIZER, budgeted=True)
    assert {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER} in other.patch
    again = admit(pod({"tencent.com/vcuda-core": "50"}, finalizers=[FINALIZER]), FACTS,
                  mutate=True, mutators=WITH_FINALIZER, budgeted=True)
    assert not any("finalizers" in op["path"] for op in again.patch)
    cpu = admit(pod({"cpu": "1"}), FACTS, mutate=True, mutators=WITH_FINALIZER, budgeted=True)
    assert not cpu.patch
    # issue #26: a namespace without a GPUBudget has nothing to settle; its deleted pods
    # must not wait for egpu controller
    unbudgeted = admit(pod({"tencent.com/vcuda-core": "50"}), FACTS, mutate=True,
                       mutators=WITH_FINALIZER)
    assert not any("finalizers" in op["path"] for op in unbudgeted.patch)
    plain = admit(pod({"tencent.com/vcuda-core": "50"}), FACTS, mutate=True)
    assert not any("finalizers" in op["path"] for op in plain.patch)  # opt-in


def test_the_lookup_feeds_admit_over_budget_only() -> None:
    asked: list[str] = []

    async def over(namespace: str) -> NamespaceBudget:
        asked.append(namespace)
        return NamespaceBudget(True, PriorityDowngrade("egpu-over-budget", -100, "Never"))

    async def within(namespace: str) -> NamespaceBudget:
        return NamespaceBudget(True)

    async def nothing(namespace: str) -> NamespaceBudget:
        return NamespaceBudget(False)

    body = review(pod({"tencent.com/vcuda-core": "50"}))
    _, payload, _ = answered(asyncio.run(Admission(FACTS, Lookups(budgets=over), mutators=WITH_FINALIZER)
                                         .review_async(body, mutate=True)))
    ops = {op["path"]: op["value"] for op in patch_of(payload)}
    assert asked == ["team"] and ops["/metadata/finalizers"] == [FINALIZER]
    assert ops["/spec/priorityClassName"] == "egpu-over-budget"
    assert ops["/spec/priority"] == -100 and ops["/spec/preemptionPolicy"] == "Never"
    _, payload, _ = answered(asyncio.run(Admission(FACTS, Lookups(budgets=within))
                                         .review_async(body, mutate=True)))
    assert not any(op["path"].startswith("/spec/priority") for op in patch_of(payload))
    _, payload, _ = answered(asyncio.run(Admission(FACTS, Lookups(budgets=nothing), mutators=WITH_FINALIZER)
                                         .review_async(body, mutate=True)))
    assert not any(op["path"].startswith("/metadata/finalizers") for op in patch_of(payload))


def _budget(name: str, over: bool, cls: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"gpuHours": 1, "period": "1h"}
    if cls:
        spec["overBudgetPriorityClassName"] = cls
    return {"metadata": {"name": name, "namespace": "team"}, "spec": spec,
            "status": {"conditions": [{"type": "OverBudget",
                                       "status": "True" if over else "False"}]}}


def test_lookup_reads_the_condition_and_the_class_and_fails_open() -> None:
    sources: list[str] = []
    lookup = BudgetLookup("egpu-over-budget", sources.append)
    lookup.budgets.replace([_budget("b", True)])
    lookup.budgets.synced.set()
    lookup.classes.replace([{"metadata": {"name": "egpu-over-budget"}, "value": -100,
                             "preemptionPolicy": "Never"}])
    assert asyncio.run(lookup("team")) == NamespaceBudget(
        True, PriorityDowngrade("egpu-over-budget", -100, "Never"))
    assert asyncio.run(lookup("elsewhere")) == NamespaceBudget(False)  # no budget: in budget
    # the first GPUBudget by name counts, as for the keeper; its own class
    lookup.budgets.replace([_budget("a", True, "custom"), _budget("b", False)])
    assert asyncio.run(lookup("team")) == NamespaceBudget(True)  # no such class
    assert sources[-1] == "failed"
    lookup.budgets.replace([_budget("a", False), _budget("b", True)])
    assert asyncio.run(lookup("team")) == NamespaceBudget(True)
    # lookups of the lower class off ('') with the finalizer on: budgets are still known
    finalizer_only = BudgetLookup("")
    finalizer_only.budgets.replace([_budget("b", True)])
    finalizer_only.budgets.synced.set()
    assert asyncio.run(finalizer_only("team")) == NamespaceBudget(True)
    assert budget_facts(_budget("x", True, "c")).priority_class == "c"
