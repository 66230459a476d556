"""The budget keeper's pure decisions (core.budget.plan_namespace, burn_rate, next_check) and
settling with a half-life."""

from __future__ import annotations

from fractions import Fraction

import pytest

from elastic_gpu.core.budget.allowance import Budget
from elastic_gpu.core.budget.ledger import ContainerRecord, PodRecord
from elastic_gpu.core.budget.plan import next_check, plan_namespace
from elastic_gpu.core.budget.settle import Settled, namespace_used
from elastic_gpu.core.budget.usage import burn_rate, decayed_usage

T0 = 1_800_000_000


def record(uid: str, share: Fraction, start: int, end: int | None, *, ns: str = "a",
           final: bool = False) -> PodRecord:
    return PodRecord(uid, ns, {"main": ContainerRecord(share, {start: end})}, final)


BUDGET = Budget(gpu_seconds=100, period_s=1000, anchor=T0)


def test_ended_pods_are_settled_once_and_released_running_ones_stay_live() -> None:
    ledger = {"done": record("done", Fraction(1), T0 + 10, T0 + 40, final=True),
              "run": record("run", Fraction(1, 2), T0 + 20, None),
              "other": record("other", Fraction(1), T0, T0 + 500, ns="b", final=True)}
    plan = plan_namespace(BUDGET, Settled(T0), ledger, "a", ["done", "run"], T0 + 60)
    assert plan.settled == Settled(T0, Fraction(30), frozenset({"done"}))
    assert plan.release == {"done"} and plan.changed
    assert plan.state.used == 30 + 20  # settled + the running pod's 40 s x 0.5
    assert not plan.state.over and plan.state.remaining == 50
    again = plan_namespace(BUDGET, plan.settled, ledger, "a", ["done", "run"], T0 + 60)
    assert again.settled == plan.settled and not again.changed  # settling twice: a no-op


def test_gone_pods_are_forgotten_after_settling_and_usage_stays() -> None:
    settled = Settled(T0, Fraction(30), frozenset({"done"}))
    ledger = {"done": record("done", Fraction(1), T0 + 10, T0 + 40, final=True)}
    plan = plan_namespace(BUDGET, settled, ledger, "a", [], T0 + 60)
    assert plan.settled == Settled(T0, Fraction(30)) and plan.changed
    assert plan.state.used == 30  # the gone record, still in the ledger, is not live too
    # the keeper drops the gone record after this write; the usage is in gpu_seconds
    plan2 = plan_namespace(BUDGET, plan.settled, {}, "a", [], T0 + 61)
    assert plan2.state.used == 30 and not plan2.changed


def test_over_budget_and_the_refill_at_the_period_end() -> None:
    ledger = {"big": record("big", Fraction(1), T0, T0 + 150, final=True)}
    plan = plan_namespace(BUDGET, Settled(T0), ledger, "a", ["big"], T0 + 200)
    assert plan.state.over and plan.state.used == 150 and plan.state.remaining == 0
    later = plan_namespace(BUDGET, plan.settled, ledger, "a", ["big"], T0 + 1001)
    assert not later.state.over and later.state.used == 0
    assert later.settled.period_start == T0 + 1000 and later.state.period_end == T0 + 2000


def test_next_check_is_the_flip_the_refresh_or_the_period_end() -> None:
    ledger = {"run": record("run", Fraction(1, 2), T0, None)}
    plan = plan_namespace(BUDGET, Settled(T0), ledger, "a", ["run"], T0 + 100)
    rate = burn_rate(ledger, "a")
    assert rate == Fraction(1, 2) and plan.state.used == 50
    assert next_check(BUDGET, plan.state, rate, T0 + 100, 30) == T0 + 130  # refresh first
    assert next_check(BUDGET, plan.state, rate, T0 + 100, 500) == T0 + 200  # 50 left / 0.5
    idle = plan_namespace(BUDGET, Settled(T0), {}, "a", [], T0 + 100)
    assert next_check(BUDGET, idle.state, Fraction(0), T0 + 100, 30) == T0 + 1000


def test_half_life_settles_a_decayed_value_that_keeps_decaying() -> None:
    budget = Budget(gpu_seconds=100, period_s=1000, anchor=T0, half_life_s=100)
    ledger = {"p": record("p", Fraction(1), T0, T0 + 50, final=True)}
    plan = plan_namespace(budget, Settled(T0), ledger, "a", ["p"], T0 + 50)
    live = decayed_usage(ledger, 100, T0 + 50)["a"]
    assert float(plan.settled.gpu_seconds) == pytest.approx(live, rel=1e-6)
    assert plan.settled.period_start == T0 + 50
    # a half-life later it counts half; the settled pod is not counted again live
    later = namespace_used(plan.settled, ledger, "a", budget, T0 + 150)
    assert float(later) == pytest.approx(live / 2, rel=1e-5)
