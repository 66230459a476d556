"""The defragmentation planner for a pending MIG pod (`core.defrag.plan_moves` with
`core.defrag.mig`): pods holding instances of its profile move to free instances of their own
profile on other nodes, the MIG layouts never change, every move and the final placement are
the engine's own, and the engine is left as it was found."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag import DefragPlan, plan_moves
from elastic_gpu.core.defrag.mig import mig_needs, single_mig_container
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

A100 = "A100-SXM4-80GB"
H100 = "H100-80GB-HBM3"
P3 = MigProfile.parse("3g.40gb")
P2 = MigProfile.parse("2g.20gb")
P1 = MigProfile.parse("1g.10gb")


def mig_node(name: str, layout: tuple[MigProfile, ...], model: str = A100,
             cpu: int = 64_000) -> Node:
    """One card carved into `layout` (instances `MIG-<name>-<k>`)."""
    instances, start = [], 0
    for k, profile in enumerate(layout):
        instances.append(MigInstance(profile, f"MIG-{name}-{k}", start))
        start += profile.slices
    return Node(name, cpu, 256 * 1024, (Card(0, f"GPU-{name}", model, 81920,
                                              mig=tuple(instances)),))


def mig_pod(name: str, count: int = 1, profile: MigProfile = P3, cpu: int = 1000,
            models: frozenset[str] | None = None) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest("main", RequestKind.MIG, count, 0, 0,
                                                         profile),),
                      cpu_milli=cpu, memory_mib=1024, allowed_models=models)


def engine_with(nodes: list[Node], placed: list[tuple[PodRequest, str, list[int]]],
                check_host: bool = False) -> tuple[Engine, dict[str, PodRequest]]:
    """An engine holding each pod on (node, its instances `k`); the movable map of them all."""
    engine = Engine(nodes, PolicyConfig(node_policy="binpack", check_host_resources=check_host),
                    seed=3)
    movable: dict[str, PodRequest] = {}
    for pod, node_name, ks in placed:
        card = engine.node(node_name).cards[0]
        shares = tuple(CardShare(0, card.uuid, 0, card.mig[k].profile.memory_gb * 1024,
                                 card.mig[k].profile.name, card.mig[k].uuid) for k in ks)
        engine.allocate(pod.key, Assignment(node_name, {"main": shares}), pod)
        movable[pod.key] = pod
    return engine, movable


def state(engine: Engine) -> tuple[Mapping[str, Assignment], Any]:
    return dict(engine.allocations()), engine.ctx.rng.bit_generator.state


def instances(a: Assignment) -> tuple[str, list[str]]:
    return a.node, sorted(s.mig_uuid or "" for s in a.shares())


def check_plan(engine: Engine, plan: DefragPlan, movable: Mapping[str, PodRequest],
               pending: PodRequest) -> None:
    """Carry the plan out in order on the engine: every move and then the pending pod fit."""
    for move in plan.moves:
        assert instances(move.target) != instances(move.source)
        assert engine.release(move.pod_key) == move.source
        engine.allocate(move.pod_key, move.target, movable[move.pod_key])
    engine.allocate(pending.key, plan.placement, pending)


def test_a_two_instance_pod_gets_a_node_by_moving_one_holder_to_a_free_instance_elsewhere() -> None:
    # two free 3g.40gb instances in the cluster, one per node: the pod needs both on one
    engine, movable = engine_with(
        [mig_node("a", (P3, P3)), mig_node("b", (P3, P3))],
        [(mig_pod("m"), "a", [0]), (mig_pod("keep"), "b", [0])])
    movable = {"default/m": movable["default/m"]}  # keep is not movable
    pending = mig_pod("pair", 2)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    before = state(engine)
    plan = plan_moves(engine, pending.key, pending, movable, 2)
    assert state(engine) == before
    assert plan is not None and plan.pod_key == pending.key
    (move,) = plan.moves
    assert move.pod_key == "default/m"
    assert instances(move.source) == ("a", ["MIG-a-0"])
    assert instances(move.target) == ("b", ["MIG-b-1"])  # the free instance of its profile
    assert instances(plan.placement) == ("a", ["MIG-a-0", "MIG-a-1"])
    assert {s.mig_profile for s in plan.placement.shares()} == {"3g.40gb"}
    check_plan(engine, plan, movable, pending)


def test_no_plan_when_the_holder_has_no_free_instance_of_its_profile_elsewhere() -> None:
    engine, movable = engine_with(
        [mig_node("a", (P3, P3)), mig_node("b", (P3, P2, P1))],
        [(mig_pod("m"), "a", [0]), (mig_pod("keep"), "b", [0])])
    pending = mig_pod("pair", 2)
    before = state(engine)
    # b's free 2g.20gb and 1g.10gb are not m's profile: the layouts are never re-carved
    assert plan_moves(engine, pending.key, pending, {"default/m": movable["default/m"]}, 4) is None
    assert state(engine) == before


def test_only_movable_holders_move_and_within_the_budget() -> None:
    # a's two instances are held by movable pods; b and c each have one free instance and
    # one held by a pod that may not move: emptying a takes two moves, one to b, one to c
    engine, movable = engine_with(
        [mig_node("a", (P3, P3)), mig_node("b", (P3, P3)), mig_node("c", (P3, P3))],
        [(mig_pod("m1"), "a", [0]), (mig_pod("m2"), "a", [1]), (mig_pod("k1"), "b", [0]),
         (mig_pod("k2"), "c", [0])])
    pending = mig_pod("pair", 2)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    ms = {k: v for k, v in movable.items() if k in ("default/m1", "default/m2")}
    assert plan_moves(engine, pending.key, pending, {}, 4) is None
    assert plan_moves(engine, pending.key, pending, {"default/m1": ms["default/m1"]}, 4) is None
    assert plan_moves(engine, pending.key, pending, ms, 1) is None
    plan = plan_moves(engine, pending.key, pending, ms, 2)
    assert plan is not None
    assert sorted(m.pod_key for m in plan.moves) == ["default/m1", "default/m2"]
    assert sorted(m.target.node for m in plan.moves) == ["b", "c"]
    assert instances(plan.placement) == ("a", ["MIG-a-0", "MIG-a-1"])
    check_plan(engine, plan, movable, pending)


def test_one_holder_of_two_instances_moves_rather_than_two_holders_of_one() -> None:
    # the pending pod runs on A100 only; the H100 node's two free instances take either
    # `two` (one move, frees a) or s1 and s2 (two moves, free b)
    engine, movable = engine_with(
        [mig_node("a", (P3, P3)), mig_node("b", (P3, P3)), mig_node("h", (P3, P3), model=H100)],
        [(mig_pod("two", 2), "a", [0, 1]), (mig_pod("s1"), "b", [0]), (mig_pod("s2"), "b", [1])])
    pending = mig_pod("pair", 2, models=frozenset({A100}))
    with pytest.raises(Unschedulable):
        engine.place(pending)
    plan = plan_moves(engine, pending.key, pending, movable, 2)
    assert plan is not None
    (move,) = plan.moves
    assert move.pod_key == "default/two"
    assert instances(move.target) == ("h", ["MIG-h-0", "MIG-h-1"])
    assert plan.placement.node == "a"
    check_plan(engine, plan, movable, pending)


def test_a_pod_pinned_by_its_model_gets_the_instance_a_movable_pod_holds_there() -> None:
    # the pending pod runs on H100 only; the H100's 3g.40gb instances are held, one by a
    # movable pod that may run on any model, which the A100 node has a free instance for
    engine, movable = engine_with(
        [mig_node("h", (P3, P3), model=H100), mig_node("a", (P3, P3))],
        [(mig_pod("m"), "h", [0]), (mig_pod("keep-h"), "h", [1]), (mig_pod("keep-a"), "a", [0])])
    pending = mig_pod("h-only", 1, models=frozenset({H100}))
    with pytest.raises(Unschedulable):
        engine.place(pending)
    plan = plan_moves(engine, pending.key, pending, {"default/m": movable["default/m"]}, 2)
    assert plan is not None
    (move,) = plan.moves
    assert instances(move.target) == ("a", ["MIG-a-1"])
    assert instances(plan.placement) == ("h", ["MIG-h-0"])
    check_plan(engine, plan, movable, pending)


def test_with_host_checks_the_node_whose_cpu_the_pod_needs_is_freed_of_a_holder() -> None:
    # b has a free 3g.40gb but too little CPU for the pending pod; a has the CPU, and its
    # 3g.40gb instances are held, one by a small pod that b's CPU can take
    engine, movable = engine_with(
        [mig_node("a", (P3, P3), cpu=64_000), mig_node("b", (P3, P3), cpu=8_000)],
        [(mig_pod("m", cpu=2000), "a", [0]), (mig_pod("keep", cpu=2000), "a", [1]),
         (mig_pod("keep-b", cpu=2000), "b", [0])], check_host=True)
    pending = mig_pod("cpu-heavy", 1, cpu=32_000)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    before = state(engine)
    plan = plan_moves(engine, pending.key, pending, {"default/m": movable["default/m"]}, 1)
    assert state(engine) == before
    assert plan is not None
    (move,) = plan.moves
    assert move.pod_key == "default/m" and move.target.node == "b"
    assert plan.placement.node == "a"
    check_plan(engine, plan, movable, pending)


def test_holders_of_other_profiles_and_unhealthy_instances_do_not_count() -> None:
    sick = Node("s", 64_000, 256 * 1024, (Card(0, "GPU-s", A100, 81920, mig=(
        MigInstance(P3, "MIG-s-0", 0, Health.UNHEALTHY), MigInstance(P3, "MIG-s-1", 4))),))
    engine, movable = engine_with(
        [sick, mig_node("b", (P3, P2, P1)), mig_node("c", (P2, P2))],
        [(mig_pod("small", 1, P2), "b", [1]), (mig_pod("m"), "s", [1])])
    pending = mig_pod("pair", 2)
    # s's other instance is unhealthy: freeing MIG-s-1 does not give two; moving the 2g.20gb
    # holder (c has room for it) frees no 3g.40gb
    assert plan_moves(engine, pending.key, pending, movable, 4) is None


def test_the_engine_is_restored_when_a_mig_trial_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, movable = engine_with(
        [mig_node("a", (P3, P3)), mig_node("b", (P3, P3))],
        [(mig_pod("m"), "a", [0]), (mig_pod("keep"), "b", [0])])
    pending = mig_pod("pair", 2)
    before = state(engine)

    def boom(*_args: object, **_kwargs: object) -> Assignment:
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "best", boom)
    with pytest.raises(RuntimeError):
        plan_moves(engine, pending.key, pending, movable, 2)
    assert state(engine) == before


def test_what_counts_as_a_mig_request() -> None:
    assert single_mig_container(mig_pod("p", 2)) is not None
    both = PodRequest("b", containers=(
        ContainerRequest("main", RequestKind.MIG, 1, 0, 0, P3), ContainerRequest.share("side", 300)))
    assert single_mig_container(both) is None and mig_needs(both) is None
    two = PodRequest("t", containers=(ContainerRequest("x", RequestKind.MIG, 1, 0, 0, P3),
                                      ContainerRequest("y", RequestKind.MIG, 2, 0, 0, P1)))
    assert single_mig_container(two) is None
    assert mig_needs(two) == {P3: 1, P1: 2}
    assert single_mig_container(PodRequest("s", containers=(ContainerRequest.share("m", 300),))) \
        is None
