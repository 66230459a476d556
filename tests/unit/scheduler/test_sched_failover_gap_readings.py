"""The failover measures' readings: which pods met the gap, and kube-scheduler's failed
attempts from its log (the integration test and bench/sched_failover.py rely on both)."""

from __future__ import annotations

from egpu_testing.failover_gap import GapPods, failed_attempts, names_in_gap, percentile

# kube-scheduler 1.36's klog lines (utilruntime.HandleError for an attempt that errored; the
# V(2) line for an unschedulable pod, which is no error)
ERROR = 'E1205 12:00:01.000100 1 schedule_one.go:1243] "Error scheduling pod; retrying" '
LOG = "\n".join([
    ERROR + 'err="Post \\"http://127.0.0.1:1/filter\\": EOF" logger="UnhandledError" pod="ns/first"',
    'I1205 12:00:01.2 1 schedule_one.go:1238] "Unable to schedule pod; no fit; waiting" '
    'pod="ns/full" err="0/2 nodes are available"',
    ERROR + 'err="EOF" pod="other/first"',
    ERROR + 'err="EOF" pod="ns/second"',
    ERROR + 'err="EOF" pod="ns/first"',
])


def test_failed_attempts_are_the_error_lines_of_the_namespace_in_log_order() -> None:
    assert failed_attempts(LOG, "ns") == ["first", "second", "first"]
    assert failed_attempts(LOG, "other") == ["first"]
    assert failed_attempts(LOG, "n") == []


def test_the_gap_is_the_pods_created_from_the_kill_until_the_new_leader_served() -> None:
    created = {"before": 9.9, "at-kill": 10.0, "claim-1": 11.0, "in": 12.0, "served": 13.5,
               "after": 13.6}
    assert names_in_gap(created, 10.0, 13.5, lambda n: not n.startswith("claim-")) == [
        "at-kill", "in", "served"]


def test_gap_line_gives_the_nearest_rank_percentiles_from_the_kill() -> None:
    gap = GapPods(100.0, 103.5, {f"p{i}": float(i) for i in range(101)})
    assert percentile(list(gap.bound_s.values()), 0.99) == 99.0
    assert gap.line() == ("101 pods created in the 3.50 s gap, bound from the kill: "
                          "p50 50.00 s, p99 99.00 s, max 100.00 s")
    assert GapPods(0.0, 1.0, {}).line() == "no pod created in the gap"
