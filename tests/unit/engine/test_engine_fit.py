"""Fit and card choice for every request kind."""

from __future__ import annotations

import pytest
from engine_helpers import cpu_only, gpu_node, mig, mig_node, nvlink_node, share, whole

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.engine import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.request import ContainerRequest, PodRequest


def test_share_goes_to_a_card_with_room_and_is_charged() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = share("a", 600, memory=4000)
    assignment = engine.place(pod)
    engine.allocate(pod.key, assignment, pod)
    (only,) = list(assignment.shares())
    assert (only.milli, only.memory_mib) == (600, 4000)
    usage = dict((i, (m, mem)) for i, m, mem in engine.card_usage("n1"))
    assert usage[only.index] == (600, 4000)
    assert engine.host_usage("n1") == (1000, 1024)


def test_share_never_exceeds_a_card() -> None:
    engine = Engine([gpu_node("n1", cards=1)])
    first = share("a", 600)
    engine.allocate(first.key, engine.place(first), first)
    with pytest.raises(Unschedulable) as err:
        engine.place(share("b", 500))
    assert err.value.category == "gpu"
    assert "50% compute" in err.value.reason


def test_card_memory_limits_shares() -> None:
    engine = Engine([gpu_node("n1", cards=1, memory=8000)])
    first = share("a", 100, memory=6000)
    engine.allocate(first.key, engine.place(first), first)
    assert engine.filter(share("b", 100, memory=3000)).feasible == []
    assert engine.filter(share("c", 100, memory=2000)).feasible == ["n1"]


def test_whole_cards_take_only_untouched_cards() -> None:
    engine = Engine([gpu_node("n1", cards=3)])
    small = share("a", 100)
    engine.allocate(small.key, engine.place(small), small)
    pod = whole("w", 2)
    assignment = engine.place(pod)
    used = {s.index for s in assignment.shares()}
    assert len(used) == 2 and next(iter(small_cards(engine, small))) not in used
    engine.allocate(pod.key, assignment, pod)
    assert engine.filter(whole("w2", 1)).feasible == []


def small_cards(engine: Engine, pod: PodRequest) -> set[int]:
    assignment = engine.allocation(pod.key)
    assert assignment is not None
    return {s.index for s in assignment.shares()}


def test_unhealthy_cards_are_never_chosen() -> None:
    engine = Engine([gpu_node("n1", cards=2, unhealthy=(0,))])
    for i in range(3):
        pod = share(f"p{i}", 300)
        assignment = engine.place(pod)
        assert {s.index for s in assignment.shares()} == {1}
        engine.allocate(pod.key, assignment, pod)
    assert engine.filter(whole("w", 1)).feasible == []


def test_allowed_and_denied_models() -> None:
    engine = Engine([gpu_node("t4", model="T4"), gpu_node("a100", model="A100")])
    only_a100 = share("a", 100, allowed_models=frozenset({"A100"}))
    assert engine.filter(only_a100).feasible == ["a100"]
    no_t4 = share("b", 100, denied_models=frozenset({"T4"}))
    assert engine.place(no_t4).node == "a100"
    result = engine.filter(share("c", 100, allowed_models=frozenset({"H100"})))
    assert result.feasible == [] and "H100" in result.failed["t4"]


def test_host_cpu_and_memory_are_checked() -> None:
    engine = Engine([gpu_node("n1", cpu=4000, mem=8192)])
    big = cpu_only("cpu", 3000, 4096)
    engine.allocate(big.key, engine.place(big), big)
    with pytest.raises(Unschedulable) as err:
        engine.place(cpu_only("more", 2000))
    assert err.value.category == "cpu"
    with pytest.raises(Unschedulable) as err2:
        engine.place(cpu_only("mem", 100, 8000))
    assert err2.value.category == "memory"


def test_host_checks_can_be_left_to_kube_scheduler() -> None:
    engine = Engine([gpu_node("n1", cpu=1000)], PolicyConfig(check_host_resources=False))
    assert engine.filter(share("a", 100, cpu=64000)).feasible == ["n1"]


def test_each_container_gets_its_own_cards_and_shares_may_meet_on_a_card() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = PodRequest("multi", containers=(
        ContainerRequest.whole("trainer", 1), ContainerRequest.share("side", 300),
        ContainerRequest.share("side2", 300), ContainerRequest("sidecar")))
    assignment = engine.place(pod)
    engine.allocate(pod.key, assignment, pod)
    trainer = {s.index for s in assignment.containers["trainer"]}
    sides = ({s.index for s in assignment.containers["side"]}
             | {s.index for s in assignment.containers["side2"]})
    assert trainer.isdisjoint(sides)
    assert len(sides) == 1  # binpack puts both shares on the one remaining card
    assert "sidecar" not in assignment.containers


def test_multi_container_pod_that_cannot_fit_is_rejected() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = PodRequest("multi", containers=(ContainerRequest.whole("a", 2), ContainerRequest.share("b", 10)))
    with pytest.raises(Unschedulable):
        engine.place(pod)


def test_mig_requests_take_free_instances_and_mig_cards_take_nothing_else() -> None:
    engine = Engine([mig_node("m")])
    first = mig("a")
    assignment = engine.place(first)
    (got,) = list(assignment.shares())
    assert got.mig_profile == "3g.40gb" and got.index == 0 and got.mig_uuid
    engine.allocate(first.key, assignment, first)
    second = mig("b")
    engine.allocate(second.key, engine.place(second), second)
    with pytest.raises(Unschedulable) as err:
        engine.place(mig("c"))
    assert err.value.category == "mig"
    # shares and whole cards only ever land on the non-MIG card 1
    for i in range(3):
        pod = share(f"s{i}", 300)
        assignment = engine.place(pod)
        assert {s.index for s in assignment.shares()} == {1}
        engine.allocate(pod.key, assignment, pod)


def test_allocating_a_held_mig_instance_fails() -> None:
    engine = Engine([mig_node("m")])
    first = mig("a")
    assignment = engine.place(first)
    engine.allocate(first.key, assignment, first)
    with pytest.raises(Unschedulable):
        engine.allocate("default/other", assignment)


def test_filter_reports_every_failed_and_unknown_node() -> None:
    engine = Engine([gpu_node("n1", cards=1), gpu_node("n2", cards=4)])
    result = engine.filter(whole("w", 2), ["n1", "n2", "ghost"])
    assert result.feasible == ["n2"]
    assert "entirely free" in result.failed["n1"]
    assert "unknown" in result.failed["ghost"]


def test_topology_card_policy_keeps_a_multi_card_request_on_one_nvlink_island() -> None:
    engine = Engine([nvlink_node()], PolicyConfig(card_policy="topology"))
    # occupy cards 0 and 5 so that the lowest free indexes would straddle the islands
    for index in (0, 5):
        engine.allocate(f"default/block{index}", Assignment("dgx", {"main": (
            CardShare(index, f"GPU-dgx-{index}", 1000, 81920),)}))
    picked = {s.index for s in engine.place(whole("w", 3)).shares()}
    assert picked in ({1, 2, 3}, {4, 6, 7})
    binpack = Engine([nvlink_node()])
    for index in (0, 5):
        binpack.allocate(f"default/block{index}", Assignment("dgx", {"main": (
            CardShare(index, f"GPU-dgx-{index}", 1000, 81920),)}))
    assert {s.index for s in binpack.place(whole("w", 3)).shares()} == {1, 2, 3}


def test_per_pod_policy_annotations_win_over_the_config() -> None:
    engine = Engine([gpu_node("a", cards=4), gpu_node("b", cards=4)], PolicyConfig(node_policy="binpack"))
    first = share("x", 500)
    engine.allocate(first.key, engine.place(first), first)
    used = engine.allocation(first.key)
    assert used is not None
    spread_pod = share("y", 100, node_policy="spread")
    assert engine.place(spread_pod).node != used.node
    assert engine.place(share("z", 100)).node == used.node
