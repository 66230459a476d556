"""Choosing the container an Allocate serves, from pods as the API returns them."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.agent.accounting import allocation_by_card
from elastic_gpu.agent.matching import (
    AllocateError,
    allocated_marks,
    candidates,
    choose,
    with_mark,
)
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare

CORE = "elasticgpu.io/gpu-core"


def pod(name: str, shares: dict[str, list[CardShare]], core: int = 30, node: str = "n1",
        created: str = "2026-01-01T00:00:00Z", **extra: Any) -> dict[str, Any]:
    annotations = {ann.ASSIGNMENT: Assignment(node, {k: tuple(v) for k, v in shares.items()})
                   .to_json()}
    annotations.update(extra.pop("annotations", {}))
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "creationTimestamp": created, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [
            {"name": c, "resources": {"limits": {CORE: str(core)}}} for c in shares]},
        "status": {"phase": extra.pop("phase", "Pending")},
    }


def share(index: int, milli: int = 300) -> CardShare:
    return CardShare(index, f"GPU-{index}", milli, 0)


def pick(pods: list[dict[str, Any]], count: int = 30, done: set[Any] | None = None) -> Any:
    found, problems = candidates(pods, "n1", CORE, count, done or set())
    return choose(found, problems, "n1", CORE, count)


def test_the_one_waiting_container_is_chosen() -> None:
    chosen = pick([pod("a", {"main": [share(0)]}), pod("b", {"main": [share(1)]}, core=50)])
    assert (chosen.pod, chosen.container, chosen.shares) == ("a", "main", (share(0),))


def test_identical_outcomes_are_not_ambiguous() -> None:
    chosen = pick([pod("late", {"main": [share(0)]}, created="2026-01-02T00:00:00Z"),
                   pod("early", {"main": [share(0)]})])
    assert chosen.pod == "early"


def test_different_cards_for_the_same_request_are_refused() -> None:
    with pytest.raises(AllocateError, match=r"ambiguous.*ns/a\[main\].*ns/b\[main\]"):
        pick([pod("a", {"main": [share(0)]}), pod("b", {"main": [share(1)]})])


def test_marked_terminal_foreign_and_other_node_pods_are_skipped() -> None:
    mark = {ann.ALLOCATED: with_mark({}, "main", CORE)}
    pods = [pod("done", {"main": [share(1)]}, annotations=mark),
            pod("finished", {"main": [share(2)]}, phase="Succeeded"),
            pod("elsewhere", {"main": [share(3)]}, node="n2"),
            pod("mine", {"main": [share(0)]})]
    assert pick(pods).pod == "mine"
    # in-memory record of earlier answers counts too
    with pytest.raises(AllocateError, match="no pod bound to n1 waits for 30"):
        pick([pod("mine", {"main": [share(0)]})], done={("uid-mine", "main", CORE)})


def test_bad_assignment_is_reported_not_used() -> None:
    bad = pod("bad", {"main": [share(0)]})
    bad["metadata"]["annotations"][ann.ASSIGNMENT] = '{"v": 9}'
    with pytest.raises(AllocateError, match="ns/bad: assignment version 9"):
        pick([bad])


def test_marks_accumulate_per_container() -> None:
    value = with_mark(allocated_marks({ann.ALLOCATED: with_mark({}, "a", CORE)}), "a", "x/y")
    assert allocated_marks({ann.ALLOCATED: value}) == {"a": (CORE, "x/y")}


def test_allocation_columns_sum_live_pods_only() -> None:
    pods = [pod("a", {"main": [share(0, 300)], "side": [share(0, 200)]}),
            pod("b", {"main": [CardShare(1, "GPU-1", 1000, 40960)]}),
            pod("gone", {"main": [share(1)]}, phase="Failed")]
    assert allocation_by_card(pods, "n1") == {0: (500, 0), 1: (1000, 40960)}
