"""Which free MIG instance a request takes (`core.mig.pick`): one rule for the device-plugin
path's engine and the DRA allocator (issues 41/42)."""

from __future__ import annotations

from elastic_gpu.core.mig.pick import card_rank, free_instances, on_partly_held, take
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

ONE = MigProfile(1, 10)
THREE = MigProfile(3, 40)


def _carved(index: int, profiles: list[tuple[MigProfile, int]], *,
            fenced: tuple[int, ...] = ()) -> Card:
    return Card(index, f"GPU-{index}", "A100-SXM4-80GB", 81920, mig=tuple(
        MigInstance(p, f"MIG-{index}-{start}", start,
                    Health.FENCED if start in fenced else Health.HEALTHY)
        for p, start in profiles))


def _cards() -> list[Card]:
    # card 0: two free 1g and nothing held (the planner could merge it back)
    # card 1: a 3g held and two free 1g (partly held)
    # card 2: one free 1g and a held 1g (partly held, fuller than card 1)
    return [_carved(0, [(ONE, 0), (ONE, 1)]),
            _carved(1, [(THREE, 4), (ONE, 0), (ONE, 1)]),
            _carved(2, [(ONE, 0), (ONE, 1)])]


HELD = {"MIG-1-4", "MIG-2-1"}


def test_partly_held_cards_first_then_the_fullest_then_the_index() -> None:
    cards = _cards()
    assert [card_rank(c, HELD) for c in cards] == [(1, 2, 0), (0, 2, 1), (0, 1, 2)]
    order = [inst.uuid for _, inst in free_instances(cards, ONE, HELD)]
    assert order == ["MIG-2-0", "MIG-1-0", "MIG-1-1", "MIG-0-0", "MIG-0-1"]
    # distinct cards: one per card, in that order
    assert [c.index for c, _ in take(free_instances(cards, ONE, HELD), 3, True)] == [2, 1, 0]
    # fenced instances and cards the caller refuses are never offered
    fenced = [_carved(0, [(ONE, 0)], fenced=(0,)), _carved(1, [(ONE, 0)])]
    assert [c.index for c, _ in free_instances(fenced, ONE, set())] == [1]
    assert free_instances(fenced, ONE, set(), usable=lambda c: c.index == 0) == []


def _mig_pod(name: str, profile: MigProfile = ONE, count: int = 1) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest("main", RequestKind.MIG, count,
                                                         mig_profile=profile),))


def test_the_engine_takes_the_instance_on_the_partly_held_card_not_the_first_free() -> None:
    """First fit (kube-scheduler's DRA allocator, and our engine before) takes card 0's
    instance: the one card nothing holds, which dynamic MIG could merge back."""
    engine = Engine([Node("n", 64000, 1 << 19, tuple(_cards()))])
    holder = _mig_pod("holder", THREE)
    engine.allocate(holder.key, engine.place(holder), holder)  # the 3g on card 1
    pod = _mig_pod("p")
    (got,) = engine.place(pod).shares()
    assert (got.index, got.mig_uuid) == (1, "MIG-1-0")
    engine.allocate(pod.key, engine.place(pod), pod)
    # two more: card 1's last free one first; cards 0 and 2 (no holder here) tie, index first
    two = _mig_pod("two", count=2)
    assert [s.mig_uuid for s in engine.place(two).shares()] == ["MIG-1-1", "MIG-0-0"]


def test_between_nodes_a_partly_held_card_comes_before_the_node_policy() -> None:
    """Node a's carved card has a free 1g and no holder; node b's has a free 1g beside a held
    3g. Binpack on CPU alone (a MIG pod's node score) prefers the smaller node a: the pod
    would open a card there that dynamic MIG could otherwise merge back."""
    a = Node("a", 16000, 1 << 16, (_carved(0, [(ONE, 0)]),))
    b = Node("b", 64000, 1 << 19, (_carved(0, [(THREE, 4), (ONE, 0)]),))
    engine = Engine([a, b], PolicyConfig(node_policy="binpack"))
    holder = _mig_pod("holder", THREE)
    engine.allocate(holder.key, engine.assign(holder, "b"), holder)
    pod = PodRequest("p", containers=(ContainerRequest("main", RequestKind.MIG, 1,
                                                       mig_profile=ONE),), cpu_milli=1000)
    assert engine.best(pod, ["a", "b"]) == "b"
    scores = engine.score(pod, ["a", "b"])
    assert scores["b"] > scores["a"]
    # a pod that is not MIG keeps the node policy's order
    cpu = PodRequest("cpu", containers=(ContainerRequest("main"),), cpu_milli=1000)
    assert engine.best(cpu, ["a", "b"]) == "a"
    by_uuid = {i.uuid: c for c in b.cards for i in c.mig}
    assert on_partly_held(by_uuid, {"MIG-0-4"}, {ONE: 1})
    assert not on_partly_held(by_uuid, {"MIG-0-4"}, {ONE: 2})  # one free there, two asked
    assert not on_partly_held(by_uuid, {"MIG-0-4"}, {ONE: 1}, usable=lambda _c: False)
    assert not on_partly_held(by_uuid, set(), {ONE: 1})
    assert not on_partly_held(by_uuid, {"MIG-0-4"}, {})
