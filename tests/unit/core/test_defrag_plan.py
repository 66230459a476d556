"""The defragmentation planner (`core.defrag.plan_moves`): fewest moves, each checked placeable
elsewhere by the engine's own fit and scoring, and the engine left as it was found."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.defrag import DefragPlan, Move, plan_moves
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.request import ContainerRequest, PodRequest

MODEL = "V100"


def node(name: str, cards: int, cpu: int = 64_000) -> Node:
    return Node(name, cpu, 256 * 1024,
                tuple(Card(i, f"GPU-{name}-{i}", MODEL, 16 * 1024) for i in range(cards)))


def share(name: str, milli: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest.share("main", milli),), cpu_milli=cpu,
                      memory_mib=1024)


def whole(name: str, cards: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest.whole("main", cards),), cpu_milli=cpu,
                      memory_mib=1024)


def engine_with(nodes: list[Node], placed: list[tuple[PodRequest, str, int]],
                policy: str = "binpack") -> tuple[Engine, dict[str, PodRequest]]:
    """An engine holding each pod on (node, card); the movable map of them all."""
    engine = Engine(nodes, PolicyConfig(node_policy=policy), seed=3)
    movable: dict[str, PodRequest] = {}
    for pod, node_name, card in placed:
        c = pod.gpu_containers[0]
        shares = tuple(engine_share(engine, node_name, card + k, c.compute_milli)
                       for k in range(c.cards))
        engine.allocate(pod.key, Assignment(node_name, {"main": shares}), pod)
        movable[pod.key] = pod
    return engine, movable


def engine_share(engine: Engine, node_name: str, index: int, milli: int) -> Any:
    from elastic_gpu.core.assignment import CardShare

    card = next(c for c in engine.node(node_name).cards if c.index == index)
    return CardShare(index, card.uuid, milli, card.memory_mib if milli >= 1000 else 0)


def state(engine: Engine) -> tuple[Mapping[str, Assignment], list[Any], Any]:
    return (dict(engine.allocations()),
            [(n, engine.card_usage(n), engine.host_usage(n)) for n in engine.nodes()],
            engine.ctx.rng.bit_generator.state)


def cards(a: Assignment) -> tuple[str, list[int]]:
    return a.node, sorted(s.index for s in a.shares())


def check_plan(engine: Engine, plan: DefragPlan, movable: Mapping[str, PodRequest],
               pending: PodRequest) -> None:
    """Carry the plan out in order on the engine: every move and then the pending pod fit."""
    for move in plan.moves:
        assert cards(move.target) != cards(move.source)
        assert engine.release(move.pod_key) == move.source
        engine.allocate(move.pod_key, move.target, movable[move.pod_key])
    engine.allocate(pending.key, plan.placement, pending)


def test_one_small_share_moved_frees_the_card_a_whole_card_pod_needs() -> None:
    engine, movable = engine_with(
        [node("a", 2), node("b", 2)],
        [(share("s1", 300), "a", 0), (share("s2", 300), "a", 1),
         (share("s3", 500), "b", 0), (share("s4", 500), "b", 1)])
    pending = whole("w", 1)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    assert plan_moves(engine, pending.key, pending, movable, 0) is None
    before = state(engine)
    plan = plan_moves(engine, pending.key, pending, movable, 2)
    assert state(engine) == before
    assert plan is not None and plan.pod_key == pending.key
    assert len(plan.moves) == 1
    (move,) = plan.moves
    assert move.source == engine.allocation(move.pod_key)
    assert move.source.node == "a" and move.pod_key in ("default/s1", "default/s2")
    assert plan.placement.node == "a"
    check_plan(engine, plan, movable, pending)


def test_two_shares_of_one_node_are_put_together_on_one_card() -> None:
    # the node's CPU is nearly all held: only a move within the node keeps it
    engine, movable = engine_with(
        [node("a", 2, cpu=16_000), node("b", 2)],
        [(share("s1", 400, cpu=6000), "a", 0), (share("s2", 400, cpu=6000), "a", 1),
         (whole("w1", 2), "b", 0)])
    pending = whole("w", 1, cpu=4000)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    plan = plan_moves(engine, pending.key, pending, movable, 1)
    assert plan is not None and len(plan.moves) == 1
    (move,) = plan.moves
    assert move.target.node == "a" and cards(move.target) != cards(move.source)
    assert plan.placement.node == "a"
    check_plan(engine, plan, movable, pending)


def test_the_fewest_moves_win_over_emptying_a_card_of_several_pods() -> None:
    engine, movable = engine_with(
        [node("a", 2), node("b", 2)],
        [(share("s1", 200), "a", 0), (share("s2", 200), "a", 0), (share("s3", 300), "a", 1),
         (share("s4", 500), "b", 0), (share("s5", 500), "b", 1)])
    pending = whole("w", 1)
    plan = plan_moves(engine, pending.key, pending, movable, 2)
    assert plan is not None
    assert [m.pod_key for m in plan.moves] == ["default/s3"]
    check_plan(engine, plan, movable, pending)


def test_a_multi_card_pod_gets_the_cards_of_several_moves_and_not_within_a_smaller_budget() -> None:
    engine, movable = engine_with(
        [node("a", 4), node("b", 2)],
        [(share("s1", 100), "a", 0), (share("s2", 100), "a", 1), (whole("w0", 2), "a", 2),
         (share("s3", 950), "b", 0)])  # too big for a card of a: b stays blocked
    pending = whole("w", 2)
    before = state(engine)
    assert plan_moves(engine, pending.key, pending, movable, 1) is None
    assert state(engine) == before
    plan = plan_moves(engine, pending.key, pending, movable, 4)
    assert plan is not None
    assert sorted(m.pod_key for m in plan.moves) == ["default/s1", "default/s2"]
    assert plan.placement.node == "a"
    assert {s.index for s in plan.placement.shares()} == {0, 1}
    check_plan(engine, plan, movable, pending)


def test_no_plan_when_the_moved_pods_fit_nowhere_else() -> None:
    engine, movable = engine_with(
        [node("a", 1), node("b", 1)],
        [(share("s1", 600), "a", 0), (share("s2", 600), "b", 0)])
    pending = whole("w", 1)
    before = state(engine)
    assert plan_moves(engine, pending.key, pending, movable, 4) is None
    assert state(engine) == before


def test_only_movable_pods_move() -> None:
    engine, movable = engine_with(
        [node("a", 2), node("b", 2)],
        [(share("s1", 300), "a", 0), (share("s2", 300), "a", 1),
         (share("s3", 500), "b", 0), (share("s4", 500), "b", 1)])
    pending = whole("w", 1)
    assert plan_moves(engine, pending.key, pending, {}, 4) is None
    only_s2 = {k: v for k, v in movable.items() if k != "default/s1"}
    plan = plan_moves(engine, pending.key, pending, only_s2, 4)
    assert plan is not None and [m.pod_key for m in plan.moves] == ["default/s2"]


def test_a_share_gets_room_on_one_card() -> None:
    engine, movable = engine_with(
        [node("a", 1), node("b", 1)],
        [(share("s1", 600), "a", 0), (share("s2", 300), "b", 0), (share("s3", 300), "b", 0)])
    pending = share("p", 500)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    plan = plan_moves(engine, pending.key, pending, movable, 2)
    assert plan is not None and len(plan.moves) == 1
    assert plan.moves[0].pod_key in ("default/s2", "default/s3")
    assert plan.placement.node == "b"
    check_plan(engine, plan, movable, pending)


def test_the_node_cpu_is_freed_when_it_is_what_is_short() -> None:
    # node a has a free card, but its CPU is held by a GPU share that node b can take
    engine, movable = engine_with(
        [node("a", 2, cpu=16_000), node("b", 2, cpu=64_000)],
        [(share("s1", 200, cpu=12_000), "a", 0), (whole("w1", 1), "b", 0),
         (share("s2", 500), "b", 1)])
    pending = whole("w", 1, cpu=8000)
    with pytest.raises(Unschedulable):
        engine.place(pending)
    only_s1 = {"default/s1": movable["default/s1"]}
    plan = plan_moves(engine, pending.key, pending, only_s1, 1)
    assert plan is not None and [m.pod_key for m in plan.moves] == ["default/s1"]
    assert plan.moves[0].target.node == "b"
    assert plan.placement.node == "a"
    check_plan(engine, plan, movable, pending)


def test_the_engine_is_restored_when_a_trial_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, movable = engine_with(
        [node("a", 2), node("b", 2)],
        [(share("s1", 300), "a", 0), (share("s2", 300), "a", 1),
         (share("s3", 500), "b", 0), (share("s4", 500), "b", 1)], policy="random")
    pending = whole("w", 1)
    before = state(engine)

    def boom(*_args: object, **_kwargs: object) -> Assignment:
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "assign", boom)
    with pytest.raises(RuntimeError):
        plan_moves(engine, pending.key, pending, movable, 2)
    assert state(engine) == before


def test_the_random_policy_leaves_the_random_source_as_it_was() -> None:
    engine, movable = engine_with(
        [node("a", 2), node("b", 2), node("c", 2)],
        [(share("s1", 300), "a", 0), (share("s2", 300), "a", 1),
         (share("s3", 500), "b", 0), (share("s4", 500), "b", 1),
         (share("s5", 500), "c", 0), (share("s6", 500), "c", 1)], policy="random")
    pending = whole("w", 1)
    before = state(engine)
    plan = plan_moves(engine, pending.key, pending, movable, 2)
    assert plan is not None
    assert state(engine) == before


def test_what_the_planner_does_not_plan() -> None:
    engine, movable = engine_with([node("a", 1)], [(share("s1", 300), "a", 0)])
    cpu_only = PodRequest("c", containers=(ContainerRequest("main"),), cpu_milli=100_000)
    assert plan_moves(engine, cpu_only.key, cpu_only, movable, 4) is None
    placed = movable["default/s1"]
    assert plan_moves(engine, placed.key, placed, movable, 4) is None  # already placed
    assert isinstance(Move("k", Assignment("a", {}), Assignment("b", {})), Move)


def test_free_cards_are_the_engines_arrays_for_the_pods_models() -> None:
    engine, _ = engine_with([node("a", 2), Node("t", 8000, 16_384, (Card(0, "GPU-t-0", "T4", 16_384),))],
                            [(share("s1", 300, cpu=2000), "a", 1)])
    free = engine.free_cards(whole("w", 1))
    assert free.names == ["a", "t"]
    a, t = free.names.index("a"), free.names.index("t")
    assert free.used_milli[a].tolist()[:2] == [0, 300]
    assert free.cpu_used[a] == 2000 and free.cpu_capacity[t] == 8000
    assert free.usable[a].tolist()[:2] == [True, True] and bool(free.usable[t, 0])
    v100_only = PodRequest("m", containers=(ContainerRequest.whole("main", 1),),
                           allowed_models=frozenset({MODEL}))
    assert not engine.free_cards(v100_only).usable[t].any()
    free.used_milli[a, 1] = 0  # a copy: the engine keeps its own
    assert engine.card_usage("a")[1][1] == 300
