"""The budget's mutator: a GPU pod of an over-budget namespace gets the lower PriorityClass."""

from __future__ import annotations

from typing import Any

import pytest

from egpu_testing.budget_ledger import fold_all
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import MUTATORS
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.admission.mutators.budget import budget_priority
from elastic_gpu.core.budget.allowance import Budget
from elastic_gpu.core.budget.ledger import observe
from elastic_gpu.core.budget.plan import plan_namespace
from elastic_gpu.core.budget.priority import PriorityDowngrade, downgrade_class
from elastic_gpu.core.budget.settle import Settled
from elastic_gpu.core.budget.timestamps import parse_time

LOWER = PriorityDowngrade("egpu-over-budget", -100, "Never")
FACTS = ClusterFacts()


def pod(resources: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                "limits": resources if resources is not None else {"tencent.com/vcuda-core": "50"}}}],
                **spec}}


def _patch(p: dict[str, Any], budget: PriorityDowngrade | None) -> list[dict[str, Any]]:
    verdict = admit(p, FACTS, mutate=True, budget=budget)
    assert verdict.allowed, verdict.message
    return [op for op in verdict.patch if op["path"].startswith("/spec/p")]


def test_budget_priority_is_one_of_the_mutators() -> None:
    assert MUTATORS[-1] is budget_priority


def test_over_budget_gpu_pod_gets_the_lower_class_priority_and_policy() -> None:
    # as the Priority plugin left it: no class named, the default priority 0
    p = pod(priority=0, preemptionPolicy="PreemptLowerPriority")
    ops = _patch(p, LOWER)
    assert ops == [
        {"op": "add", "path": "/spec/priorityClassName", "value": "egpu-over-budget"},
        {"op": "replace", "path": "/spec/priority", "value": -100},
        {"op": "replace", "path": "/spec/preemptionPolicy", "value": "Never"}]
    spec = apply_patch(p, ops)["spec"]
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == \
        ("egpu-over-budget", -100, "Never")
    # reinvocation (reinvocationPolicy IfNeeded): nothing more
    assert _patch(apply_patch(p, ops), LOWER) == []


def test_a_named_higher_class_is_replaced() -> None:
    ops = _patch(pod(priorityClassName="high", priority=1000), PriorityDowngrade("low", 10))
    assert ops == [{"op": "replace", "path": "/spec/priorityClassName", "value": "low"},
                   {"op": "replace", "path": "/spec/priority", "value": 10}]


@pytest.mark.parametrize(("p", "budget"), [
    (pod(priority=0), None),  # in budget (or no budget): left alone
    (pod({"cpu": "1"}, priority=0), LOWER),  # not a GPU pod
    (pod(priorityClassName="batch-low", priority=-1000), LOWER),  # already lower: never raised
    (pod(priorityClassName="egpu-over-budget", priority=-100, preemptionPolicy="Never"), LOWER),
])
def test_left_alone(p: dict[str, Any], budget: PriorityDowngrade | None) -> None:
    assert _patch(p, budget) == []


def test_downgrade_only_while_over_budget() -> None:
    ledger = fold_all([observe({
        "metadata": {"uid": "u", "namespace": "team-a"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"containerStatuses": [{"name": "main", "state": {"terminated": {
            "startedAt": "2026-11-24T00:00:00Z", "finishedAt": "2026-11-24T00:01:00Z"}}}]}})])
    budget = Budget(gpu_seconds=60, period_s=3600, anchor=parse_time("2026-11-24T00:00:00Z", "t"))
    def over(now: int) -> bool:  # the keeper's decision, written as the OverBudget condition
        return plan_namespace(budget, Settled(budget.anchor), ledger, "team-a", ["u"],
                              now).state.over

    spent = over(budget.anchor + 120)
    assert spent
    assert downgrade_class(spent, None, "egpu-over-budget") == "egpu-over-budget"
    assert downgrade_class(spent, "batch-low", "egpu-over-budget") == "batch-low"  # its own
    assert downgrade_class(spent, "batch-low", "") is None  # the webhook's downgrades are off
    fresh = over(budget.anchor + 3600)  # refilled
    assert not fresh
    assert downgrade_class(fresh, "batch-low", "egpu-over-budget") is None
