"""Defragmentation planning with multi-card shares (issue 40): a pending share on N cards gets
room freed on N distinct cards, and a placed one moves as a whole to N cards elsewhere."""

from __future__ import annotations

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag import plan_moves
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.request import ContainerRequest, PodRequest


def node(name: str, cards: int) -> Node:
    return Node(name, 64_000, 256 * 1024,
                tuple(Card(i, f"GPU-{name}-{i}", "V100", 16 * 1024) for i in range(cards)))


def pod(name: str, milli: int, cards: int = 1) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest.share("main", milli, 0, cards),),
                      cpu_milli=1000, memory_mib=1024)


def hold(engine: Engine, p: PodRequest, node_name: str, *indexes: int) -> None:
    milli = p.gpu_containers[0].compute_milli
    shares = tuple(CardShare(i, f"GPU-{node_name}-{i}", milli, 0) for i in indexes)
    engine.allocate(p.key, Assignment(node_name, {"main": shares}), p)


def test_a_pending_multi_share_gets_room_freed_on_n_cards() -> None:
    """a: both cards 70% held; b: one card 70% held, one free; c: one free card. A 50% share
    on two cards fits nowhere; one move (b's pod to c) leaves b two cards with room."""
    engine = Engine([node("a", 2), node("b", 2), node("c", 1)],
                    PolicyConfig(node_policy="binpack"), seed=1)
    movable = {}
    for name, where, card in (("s0", "a", 0), ("s1", "a", 1), ("big", "b", 0)):
        p = pod(name, 700)
        hold(engine, p, where, card)
        movable[p.key] = p
    pending = pod("multi", 500, cards=2)
    assert engine.filter(pending).feasible == []
    plan = plan_moves(engine, pending.key, pending, movable, max_moves=2)
    assert plan is not None
    (move,) = plan.moves
    assert (move.pod_key, move.target.node) == ("default/big", "c")
    assert plan.placement.node == "b"
    assert sorted(s.index for s in plan.placement.shares()) == [0, 1]


def test_a_placed_multi_share_moves_whole_to_n_cards_elsewhere() -> None:
    """A 40% share on both cards of a; b has 40% left on two cards and one free card. Two
    whole cards fit nowhere until the share moves to b, on two distinct cards."""
    engine = Engine([node("a", 2), node("b", 3)], PolicyConfig(node_policy="binpack"), seed=1)
    placed = pod("ms", 400, cards=2)
    hold(engine, placed, "a", 0, 1)
    hold(engine, pod("x", 600), "b", 0)
    hold(engine, pod("y", 600), "b", 1)
    whole = PodRequest("w", containers=(ContainerRequest.whole("main", 2),), cpu_milli=1000,
                       memory_mib=1024)
    assert engine.filter(whole).feasible == []
    plan = plan_moves(engine, whole.key, whole, {placed.key: placed}, max_moves=2)
    assert plan is not None
    (move,) = plan.moves
    assert move.target.node == "b"
    assert len({s.index for s in move.target.shares()}) == 2
    assert plan.placement.node == "a"
