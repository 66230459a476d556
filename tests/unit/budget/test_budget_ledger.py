"""The GPU-time ledger (core.budget): shares, runs, idempotent merge, periods, decay."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_testing.budget_ledger import budget_state, fold_all
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.budget.allowance import MIN_PERIOD_S, Budget, period_bounds
from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.ledger import merge, observe
from elastic_gpu.core.budget.settle import ended
from elastic_gpu.core.budget.shares import container_shares
from elastic_gpu.core.budget.usage import record_usage, usage

T0 = 1_700_000_000  # an epoch second


def ts(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(uid: str = "u1", ns: str = "team-a", resources: dict[str, Any] | None = None,
        assignment: Assignment | None = None, statuses: list[dict[str, Any]] | None = None,
        deleted: int | None = None, container: str = "main") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"p-{uid}", "namespace": ns, "uid": uid, "annotations": {}}
    if assignment is not None:
        meta["annotations"]["elasticgpu.io/assignment"] = assignment.to_json()
    if deleted is not None:
        meta["deletionTimestamp"] = ts(deleted)
    return {"metadata": meta,
            "spec": {"containers": [{"name": container, "resources": {
                "limits": resources if resources is not None else {"nvidia.com/gpu": "1"}}}]},
            "status": {"containerStatuses": statuses or []}}


def running(start: int, name: str = "main", last: tuple[int, int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "state": {"running": {"startedAt": ts(start)}}}
    if last:
        out["lastState"] = {"terminated": {"startedAt": ts(last[0]), "finishedAt": ts(last[1])}}
    return out


def terminated(start: int, end: int, name: str = "main") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"startedAt": ts(start), "finishedAt": ts(end)}}}


# ------------------------------------------------------------------ shares


@pytest.mark.parametrize(("resources", "share"), [
    ({"nvidia.com/gpu": "2"}, Fraction(2)),
    ({"tencent.com/vcuda-core": "30"}, Fraction(3, 10)),
    ({"nano-gpu/gpu-percent": "50"}, Fraction(1, 2)),
    ({"elasticgpu.io/gpu-core": "25"}, Fraction(1, 4)),
    ({"nvidia.com/mig-3g.40gb": "2"}, Fraction(6, 7)),
])
def test_share_from_request(resources: dict[str, str], share: Fraction) -> None:
    assert container_shares(pod(resources=resources)) == {"main": share}


def test_no_gpu_pod_has_no_record() -> None:
    assert container_shares(pod(resources={"cpu": "1"})) == {}
    assert observe(pod(resources={"cpu": "1"}, statuses=[running(T0)])) is None


def test_share_from_assignment_whole_share_mig_and_claims() -> None:
    assignment = Assignment("n1", {
        "whole": (CardShare(0, "G0", 1000, 0), CardShare(1, "G1", 1000, 0)),
        "part": (CardShare(2, "G2", 300, 0),),
        "mig": (CardShare(3, "G3", 0, 0, "1g.10gb", "MIG-a"),
                CardShare(3, "G3", 0, 0, "2g.20gb", "MIG-b")),
        "claimed": (CardShare(4, "G4", 500, 0),),
    }, claims={"claimed": "egpu-1"})
    # the assignment wins over the request (here: one whole card for "main" only)
    assert container_shares(pod(assignment=assignment)) == {
        "whole": Fraction(2), "part": Fraction(3, 10), "mig": Fraction(3, 7),
        "claimed": Fraction(1, 2)}


def test_bad_assignment_is_an_error_naming_the_annotation() -> None:
    p = pod()
    p["metadata"]["annotations"]["elasticgpu.io/assignment"] = "{nope"
    with pytest.raises(BudgetError, match=r"elasticgpu\.io/assignment"):
        container_shares(p)


def test_bad_timestamp_names_the_field() -> None:
    bad = {"name": "main", "state": {"running": {"startedAt": "yesterday"}}}
    with pytest.raises(BudgetError, match=r"containerStatuses\[0\]\.state\.running\.startedAt"):
        observe(pod(statuses=[bad]))


# ------------------------------------------------------------------ runs and usage


def test_running_counts_up_to_now_and_restarts_keep_the_earlier_run() -> None:
    rec = observe(pod(resources={"tencent.com/vcuda-core": "50"},
                        statuses=[running(T0 + 100, last=(T0, T0 + 60))]))
    assert rec is not None
    # 60 s of the first run + 40 s of the current one, at half a card
    assert record_usage(rec, 0, 2 * T0, T0 + 140) == 50


def test_deleted_pod_still_running_is_closed_at_its_deletion_timestamp() -> None:
    rec = observe(pod(statuses=[running(T0)], deleted=T0 + 30))
    assert rec is not None
    assert record_usage(rec, 0, 2 * T0, T0 + 1000) == 30


def test_a_real_finish_or_a_shortened_grace_period_wins_over_the_first_deletion_time() -> None:
    # kubectl delete (grace 30 s), then kubelet reports the container's end 5 s later
    first = observe(pod(statuses=[running(T0)], deleted=T0 + 100))
    finished = observe(pod(statuses=[terminated(T0, T0 + 75)], deleted=T0 + 100))
    ledger = fold_all([first, finished])
    assert usage(ledger, 0, 2 * T0, T0 + 1000) == {"team-a": 75}
    assert ended(ledger["u1"], T0 + 80)  # released before the grace period is over
    # the grace period shortened to 0 (kwok, a force delete): the earlier instant counts
    forced = fold_all([first, observe(pod(statuses=[running(T0)], deleted=T0 + 72))])
    assert usage(forced, 0, 2 * T0, T0 + 1000) == {"team-a": 72}
    assert ended(forced["u1"], T0 + 72) and not ended(forced["u1"], T0 + 71)


def test_termination_seen_after_running_closes_the_run() -> None:
    ledger = fold_all([observe(pod(statuses=[running(T0)])),
                         observe(pod(statuses=[terminated(T0, T0 + 10)])),
                         observe(pod(statuses=[running(T0)]))])  # a stale one, late
    assert usage(ledger, 0, 2 * T0, T0 + 500) == {"team-a": 10}


def test_merge_of_different_pods_is_refused() -> None:
    one, two = observe(pod("a", statuses=[running(T0)])), observe(pod("b"))
    assert one is not None and two is not None
    with pytest.raises(BudgetError):
        merge(one, two)


# ------------------------------------------------------------------ properties

STATUS = st.one_of(
    st.builds(lambda s: running(T0 + s), st.integers(0, 500)),
    st.builds(lambda s, d: terminated(T0 + s, T0 + s + d), st.integers(0, 500), st.integers(0, 500)),
    st.builds(lambda s, d, g: running(T0 + s + d + g, last=(T0 + s, T0 + s + d)),
              st.integers(0, 300), st.integers(0, 100), st.integers(0, 100)),
)
OBS = st.builds(lambda uid, ns, status, share: pod(uid, ns, {"tencent.com/vcuda-core": str(share)},
                                                   statuses=[status]),
                st.sampled_from(["u1", "u2", "u3", "u4"]), st.sampled_from(["a", "b"]),
                STATUS, st.sampled_from([10, 50, 99]))


def _consistent(observations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pod has one namespace and one share (as in the API)."""
    first: dict[str, dict[str, Any]] = {}
    for o in observations:
        first.setdefault(o["metadata"]["uid"], o)
    for o in observations:
        f = first[o["metadata"]["uid"]]
        o["metadata"]["namespace"] = f["metadata"]["namespace"]
        o["spec"] = f["spec"]
    return observations


@settings(max_examples=200, deadline=None)
@given(st.lists(OBS, min_size=1, max_size=12), st.randoms(use_true_random=False),
       st.integers(0, 3))
def test_order_and_duplicates_do_not_change_totals(obs: list[dict[str, Any]], rnd: Any,
                                                   dups: int) -> None:
    obs = _consistent(obs)
    records = [observe(o) for o in obs]
    again = records + [rnd.choice(records) for _ in range(dups)]
    rnd.shuffle(again)
    one, two = fold_all(records), fold_all(again)
    assert one == two
    now = T0 + 2000
    assert usage(one, 0, 2 * T0, now) == usage(two, 0, 2 * T0, now)
    # folding the whole ledger into itself adds nothing
    assert fold_all(one.values(), one) == one


@settings(max_examples=200, deadline=None)
@given(st.lists(OBS, min_size=1, max_size=10), st.integers(MIN_PERIOD_S, 400),
       st.integers(0, 1500))
def test_periods_split_at_the_boundary_sum_to_the_whole(obs: list[dict[str, Any]], period: int,
                                                        offset: int) -> None:
    ledger = fold_all(observe(o) for o in _consistent(obs))
    now = T0 + 1500
    budget = Budget(gpu_seconds=100, period_s=period, anchor=T0 - offset)
    whole = usage(ledger, 0, 2 * T0, now)
    summed: dict[str, Fraction] = {}
    start, _ = period_bounds(budget, T0 - 1)
    while start < now:
        for ns, used in usage(ledger, start, start + period, now).items():
            summed[ns] = summed.get(ns, Fraction(0)) + used
        start += period
    assert summed == whole


# ------------------------------------------------------------------ budgets


def test_period_refills_and_a_run_across_the_boundary_is_split() -> None:
    budget = Budget(gpu_seconds=60, period_s=100, anchor=T0)
    ledger = fold_all([observe(pod(statuses=[running(T0 + 50)]))])
    state = budget_state(budget, ledger, "team-a", T0 + 99)
    assert (state.used, state.remaining, state.over) == (49, 11, False)
    assert (state.period_start, state.period_end) == (T0, T0 + 100)
    state = budget_state(budget, ledger, "team-a", T0 + 110)
    # refilled: only the 10 s after the boundary count in the new period
    assert (state.used, state.remaining, state.over) == (10, 50, False)
    state = budget_state(budget, ledger, "team-a", T0 + 170)
    assert (state.used, state.remaining, state.over, state.period_start) == (70, 0, True, T0 + 100)
    # another namespace is untouched
    assert not budget_state(budget, ledger, "team-b", T0 + 170).over


def test_decay_half_life() -> None:
    budget = Budget(gpu_seconds=100, period_s=60, half_life_s=100)
    ledger = fold_all([observe(pod(statuses=[terminated(T0, T0 + 100)]))])
    # integral of 2^(-(now-t)/h) over [now-100, now] = h/ln2 * (1 - 1/2)
    state = budget_state(budget, ledger, "team-a", T0 + 100)
    assert math.isclose(float(state.used), 100 / math.log(2) / 2, rel_tol=1e-9)
    later = budget_state(budget, ledger, "team-a", T0 + 200)
    assert math.isclose(float(later.used), float(state.used) / 2, rel_tol=1e-9)


def test_over_budget_at_exactly_the_allowance_and_zero_budget() -> None:
    ledger = fold_all([observe(pod(statuses=[terminated(T0, T0 + 10)]))])
    assert budget_state(Budget(10, 1000, T0), ledger, "team-a", T0 + 20).over
    assert not budget_state(Budget(11, 1000, T0), ledger, "team-a", T0 + 20).over
    assert budget_state(Budget(0, 1000, T0), {}, "team-a", T0).over


@pytest.mark.parametrize("kwargs", [{"gpu_seconds": -1, "period_s": 3600},
                                    {"gpu_seconds": 1, "period_s": 0},
                                    {"gpu_seconds": 1, "period_s": 1},
                                    {"gpu_seconds": 1, "period_s": MIN_PERIOD_S - 1},
                                    {"gpu_seconds": 1, "period_s": 3600, "half_life_s": 0}])
def test_bad_budget_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(BudgetError):
        Budget(**kwargs)


def test_the_period_floor_is_a_minute() -> None:
    """Issue #26 item 7: the status is rewritten once a period, so the period has a floor."""
    assert Budget(1, MIN_PERIOD_S).period_s == 60
    with pytest.raises(BudgetError, match="period=1s must be at least 60s"):
        Budget(1, 1)
