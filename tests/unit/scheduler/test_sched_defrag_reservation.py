"""The extender keeps a defragmentation reservation (`elasticgpu.io/defrag-reservation`, written
by the controller on a pending pod) for that pod: another pod is refused those cards, the pod
itself takes them (and is steered to its node), and the reservation ends when the pod binds, is
deleted or the expiry passes (`core.defrag.reservation`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.reservation import DefragReservation
from elastic_gpu.core.fit import FitKind
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state import SchedulerState

WALL = 1_800_000_000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gpu_node(name: str) -> Node:
    return Node(name, 64_000, 256_000, (Card(0, f"GPU-{name}-0", "T4", 16384),))


def share_pod(name: str, percent: int) -> dict[str, Any]:
    return pod_manifest(name, uid=f"uid-{name}",
                        limits={"elasticgpu.io/gpu-core": str(percent)})


def reserved(pod: dict[str, Any], node: str, milli: int, expires: float) -> dict[str, Any]:
    """`pod` with the reservation the controller writes: `milli` of `node`'s card 0."""
    pod = json.loads(json.dumps(pod))
    share = CardShare(0, f"GPU-{node}-0", milli, 0)
    text = DefragReservation(Assignment(node, {"main": (share,)}), expires).to_json()
    pod["metadata"].setdefault("annotations", {})[ann.DEFRAG_RESERVATION] = text
    pod["metadata"]["resourceVersion"] = "5"
    return pod


def make(filter_result: str = "all") -> tuple[SchedulerState, Clock, dict[str, Any]]:
    """n1 and n2, one T4 each; `whole` (80 %) pending with 80 % of n1's card reserved for
    two minutes."""
    wall = Clock(WALL)
    state = SchedulerState(SchedulerConfig(filter_result=filter_result), wall_clock=wall)
    whole = reserved(share_pod("whole", 80), "n1", 800, WALL + 120)
    return ready_state([gpu_node("n1"), gpu_node("n2")], state, [whole]), wall, whole


def req(pod: dict[str, Any]) -> Any:
    return pod_request_from_manifest(pod)


def test_another_pod_is_refused_the_reserved_card_with_the_fit_reason() -> None:
    state, _, _ = make()
    other = share_pod("other", 50)
    result = state.filter(req(other), "uid-other", ["n1", "n2"])
    assert result.feasible == ["n2"]
    failure = result.failed["n1"]
    assert (failure.kind, failure.per_card_milli, failure.free) == (
        FitKind.INSUFFICIENT_SHARE, 500, 0)
    with pytest.raises(Unschedulable):
        state.reserve(req(other), "uid-other", "n1")
    # a share that fits beside the reservation still may (20 % is left)
    assert state.filter(req(share_pod("small", 20)), "uid-small", ["n1"]).feasible == ["n1"]


def test_the_pending_pod_takes_its_reserved_cards_and_is_steered_to_them() -> None:
    state, _, whole = make()
    assert state.filter(req(whole), "uid-whole", ["n1", "n2"]).feasible == ["n1", "n2"]
    scores = state.prioritize(req(whole), "uid-whole", ["n1", "n2"])
    assert scores["n1"] == 10 and scores["n2"] <= 9
    best, _, _ = make("best")
    assert best.filter(req(whole), "uid-whole", ["n2", "n1"]).feasible == ["n1"]
    token, assignment = state.reserve(req(whole), "uid-whole", "n1")
    assert assignment.node == "n1"
    # the bind's reservation holds the cards now, the defragmentation one no longer counts
    assert state.inflight() == {"uid-whole": [assignment]} and "uid-whole" not in state.holds()
    state.settle("uid-whole", token, "bound", with_binding(whole, "n1", assignment))
    assert state.holds()["uid-whole"] == assignment  # its assignment replaced the reservation
    assert state.filter(req(share_pod("other", 50)), "uid-other", ["n1"]).feasible == []


def test_a_refused_bind_gives_the_reservation_back() -> None:
    state, _, whole = make()
    token, _ = state.reserve(req(whole), "uid-whole", "n1")
    state.settle("uid-whole", token, "failed")
    assert state.holds()["uid-whole"].node == "n1"
    assert state.filter(req(share_pod("other", 50)), "uid-other", ["n1"]).feasible == []


def test_expiry_and_deletion_free_the_cards() -> None:
    state, wall, _ = make()
    other = share_pod("other", 50)
    assert state.filter(req(other), "uid-other", ["n1"]).feasible == []
    wall.now = WALL + 120  # the expiry: over
    assert state.filter(req(other), "uid-other", ["n1"]).feasible == ["n1"]
    assert "uid-whole" not in state.holds()
    state, _, _ = make()
    state.forget_pod("uid-whole")
    assert state.filter(req(other), "uid-other", ["n1"]).feasible == ["n1"]


def test_a_reservation_too_far_ahead_or_unreadable_holds_nothing() -> None:
    wall = Clock(WALL)
    state = SchedulerState(wall_clock=wall)
    far = reserved(share_pod("far", 80), "n1", 800, WALL + 3600)  # past MAX_AHEAD_S
    bad = share_pod("bad", 80)
    bad["metadata"]["annotations"] = {ann.DEFRAG_RESERVATION: "{not json"}
    ready_state([gpu_node("n1")], state, [far, bad])
    assert state.holds() == {}
    assert state.pod("uid-bad").reservation_error.startswith("reservation is not JSON")


def test_a_reservation_is_no_preemption_victim() -> None:
    state, _, _ = make()
    important = pod_manifest("vip", uid="uid-vip", priority=1000,
                             limits={"elasticgpu.io/gpu-core": "50"})
    assert state.preempt(req(important), "uid-vip", {"n1": ([], 0)}) == {}


def test_a_pod_turned_away_by_a_reservation_is_woken_when_it_expires() -> None:
    state, wall, _ = make()
    waiting = share_pod("waiting", 50)
    assert state.filter(req(waiting), "uid-waiting", ["n1"]).feasible == []
    assert not state.wakeup_pending()
    wall.now = WALL + 120
    assert state.wakeup_pending()  # the API worker link starts a round, which expires it
    assert [(w.name, w.node) for w in state.wakeups()] == [("waiting", "n1")]


def mig_node(name: str) -> Node:
    """One A100-80GB carved into two 3g.40gb instances (`MIG-<name>-0`, `MIG-<name>-1`)."""
    profile = MigProfile.parse("3g.40gb")
    return Node(name, 64_000, 256_000, (Card(0, f"GPU-{name}-0", "A100-SXM4-80GB", 81920, mig=(
        MigInstance(profile, f"MIG-{name}-0", 0), MigInstance(profile, f"MIG-{name}-1", 4))),))


def mig_pod(name: str, count: int) -> dict[str, Any]:
    return pod_manifest(name, uid=f"uid-{name}", limits={"nvidia.com/mig-3g.40gb": str(count)})


def test_a_mig_reservation_keeps_its_instances_for_the_pending_pod() -> None:
    # the planner's MIG plan: both of n1's 3g.40gb instances for `pair` (one was just freed)
    wall = Clock(WALL)
    state = SchedulerState(SchedulerConfig(), wall_clock=wall)
    shares = tuple(CardShare(0, "GPU-n1-0", 0, 40960, "3g.40gb", f"MIG-n1-{k}") for k in (0, 1))
    pair = mig_pod("pair", 2)
    pair["metadata"]["annotations"] = {ann.DEFRAG_RESERVATION: DefragReservation(
        Assignment("n1", {"main": shares}), WALL + 120).to_json()}
    pair["metadata"]["resourceVersion"] = "5"
    state = ready_state([mig_node("n1"), mig_node("n2")], state, [pair])
    # the moved pod's replacement (one 3g.40gb) is kept off n1's instances: n2's it gets
    moved = mig_pod("moved", 1)
    result = state.filter(req(moved), "uid-moved", ["n1", "n2"])
    assert result.feasible == ["n2"]
    assert result.failed["n1"].kind is FitKind.INSUFFICIENT_MIG
    # the pending pod takes both, and binds on them
    assert state.filter(req(pair), "uid-pair", ["n1", "n2"]).feasible == ["n1", "n2"]
    assert state.prioritize(req(pair), "uid-pair", ["n1", "n2"])["n1"] == 10
    token, assignment = state.reserve(req(pair), "uid-pair", "n1")
    assert sorted(s.mig_uuid or "" for s in assignment.shares()) == ["MIG-n1-0", "MIG-n1-1"]
    state.settle("uid-pair", token, "bound", with_binding(pair, "n1", assignment))
    assert state.holds()["uid-pair"] == assignment
    # past the expiry nothing changes for a bound pod: its assignment holds the instances
    wall.now = WALL + 600
    assert state.filter(req(moved), "uid-moved", ["n1"]).feasible == []


def bound(pod: dict[str, Any], assignment: Assignment) -> dict[str, Any]:
    out = with_binding(pod, assignment.node, assignment)
    out["metadata"]["resourceVersion"] = "3"
    return out


def test_a_mig_reservation_written_before_the_move_keeps_the_free_instance_at_once() -> None:
    # the controller's order: the reservation first, while `m` still holds one of the two
    # instances, then the eviction. m's replacement is created at the eviction, before m is
    # gone: n1's free instance must already be pair's (the CI run where it was not left
    # `pair` Pending: the replacement took it)
    wall = Clock(WALL)
    state = SchedulerState(SchedulerConfig(), wall_clock=wall)
    shares = tuple(CardShare(0, "GPU-n1-0", 0, 40960, "3g.40gb", f"MIG-n1-{k}") for k in (0, 1))
    m = bound(mig_pod("m", 1), Assignment("n1", {"main": (shares[0],)}))
    pair = mig_pod("pair", 2)
    pair["metadata"]["annotations"] = {ann.DEFRAG_RESERVATION: DefragReservation(
        Assignment("n1", {"main": shares}), WALL + 120).to_json()}
    pair["metadata"]["resourceVersion"] = "5"
    state = ready_state([mig_node("n1"), mig_node("n2")], state, [m, pair])
    moved = mig_pod("moved", 1)
    assert state.filter(req(moved), "uid-moved", ["n1", "n2"]).feasible == ["n2"]
    assert state.holds()["uid-pair"] == Assignment("n1", {"main": (shares[1],)})
    assert "uid-pair" in state.conflicts()  # the rest is still m's
    assert state.filter(req(pair), "uid-pair", ["n1"]).feasible == []  # not yet: m is there
    # m goes: the whole reservation holds at once (no inventory change needed), and pair fits
    state.forget_pod("uid-m")
    assert state.holds()["uid-pair"] == Assignment("n1", {"main": shares})
    assert not state.conflicts()
    assert state.filter(req(moved), "uid-moved", ["n1", "n2"]).feasible == ["n2"]
    assert state.filter(req(pair), "uid-pair", ["n1"]).feasible == ["n1"]
    _, assignment = state.reserve(req(pair), "uid-pair", "n1")
    assert sorted(s.mig_uuid or "" for s in assignment.shares()) == ["MIG-n1-0", "MIG-n1-1"]


def test_a_share_reservation_keeps_the_free_part_of_its_card_and_grows_as_the_moved_go() -> None:
    a = bound(share_pod("a", 30), Assignment("n1", {"main": (CardShare(0, "GPU-n1-0", 300, 0),)}))
    b = bound(share_pod("b", 30), Assignment("n1", {"main": (CardShare(0, "GPU-n1-0", 300, 0),)}))
    wall = Clock(WALL)
    state = SchedulerState(SchedulerConfig(), wall_clock=wall)
    whole = reserved(share_pod("whole", 80), "n1", 800, WALL + 120)
    state = ready_state([gpu_node("n1"), gpu_node("n2")], state, [a, b, whole])
    # a and b still there: the 40 % left is whole's, a 30 % replacement goes elsewhere
    assert state.holds()["uid-whole"].containers["main"][0].milli == 400
    assert state.filter(req(share_pod("a2", 30)), "uid-a2", ["n1", "n2"]).feasible == ["n2"]
    state.forget_pod("uid-a")
    assert state.holds()["uid-whole"].containers["main"][0].milli == 700
    state.forget_pod("uid-b")
    assert state.holds()["uid-whole"].containers["main"][0].milli == 800
    assert not state.conflicts()
    assert state.filter(req(share_pod("a2", 30)), "uid-a2", ["n1", "n2"]).feasible == ["n2"]
    assert state.filter(req(share_pod("small", 20)), "uid-small", ["n1"]).feasible == ["n1"]
    assert state.filter(req(whole), "uid-whole", ["n1"]).feasible == ["n1"]


def test_a_partial_reservation_wakes_its_pod_when_its_node_frees() -> None:
    wall = Clock(WALL)
    state = SchedulerState(SchedulerConfig(), wall_clock=wall)
    a = bound(share_pod("a", 30), Assignment("n1", {"main": (CardShare(0, "GPU-n1-0", 300, 0),)}))
    whole = reserved(share_pod("whole", 80), "n1", 800, WALL + 120)
    state = ready_state([gpu_node("n1")], state, [a, whole])
    assert state.filter(req(whole), "uid-whole", ["n1"]).feasible == []  # turned away: waits
    state.forget_pod("uid-a")
    assert [(w.name, w.node) for w in state.wakeups()] == [("whole", "n1")]
