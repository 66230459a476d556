"""Observed usage in fit: out-of-band memory is taken off a card's free memory (issue 28)."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import gpu_node, share, whole

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitKind, Unit, describe
from elastic_gpu.core.model import Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.usage import CardUsage

GIB = 1024


def observed(node: Node, **per_card: CardUsage) -> Node:
    """The node with `Card.usage` set on the cards named c0, c1, ..."""
    cards = tuple(dataclasses.replace(c, usage=per_card.get(f"c{c.index}", c.usage))
                  for c in node.cards)
    return dataclasses.replace(node, cards=cards)


def oob(mib: int, sm: int = 0) -> CardUsage:
    return CardUsage(used_mib=mib, out_of_band_mib=mib, sm_percent=sm)


def big_node(name: str = "n1", cards: int = 1) -> Node:
    return gpu_node(name, cards=cards, model="A100", memory=80 * GIB)


def test_out_of_band_memory_refuses_a_share_that_would_overflow_the_card() -> None:
    engine = Engine([observed(big_node(), c0=oob(60 * GIB))])
    pod = share("a", 200, memory=30 * GIB)
    result = engine.filter(pod)
    assert result.feasible == []
    failure = result.failed["n1"]
    assert failure.kind is FitKind.OUT_OF_BAND_MEMORY
    assert (failure.card, failure.out_of_band_mib, failure.capacity, failure.free,
            failure.requested, failure.unit) == (0, 60 * GIB, 80 * GIB, 20 * GIB, 30 * GIB,
                                                 Unit.MIB)
    text = describe(failure)
    assert "61440 MiB" in text and "out of band" in text and "20480 MiB" in text
    with pytest.raises(Unschedulable) as err:
        engine.place(pod)
    assert err.value.kind is FitKind.OUT_OF_BAND_MEMORY
    assert "out of band" in err.value.reason


def test_a_share_that_fits_beside_out_of_band_memory_is_placed() -> None:
    engine = Engine([observed(big_node(), c0=oob(60 * GIB))])
    assert engine.filter(share("a", 200, memory=20 * GIB)).feasible == ["n1"]


def test_ledger_and_out_of_band_memory_add_up() -> None:
    engine = Engine([observed(big_node(), c0=oob(40 * GIB))])
    first = share("a", 200, memory=30 * GIB)
    engine.allocate(first.key, engine.place(first), first)
    failure = engine.filter(share("b", 200, memory=20 * GIB)).failed["n1"]
    assert failure.kind is FitKind.OUT_OF_BAND_MEMORY
    assert failure.free == 10 * GIB


def test_the_share_goes_to_the_card_without_out_of_band_memory() -> None:
    engine = Engine([observed(big_node(cards=2), c0=oob(60 * GIB))])
    assignment = engine.place(share("a", 200, memory=30 * GIB))
    assert [s.index for s in assignment.shares()] == [1]


def test_a_share_short_of_compute_is_not_blamed_on_out_of_band_memory() -> None:
    engine = Engine([observed(big_node(), c0=oob(60 * GIB))])
    first = share("a", 900, memory=GIB)
    engine.allocate(first.key, engine.place(first), first)
    failure = engine.filter(share("b", 200, memory=30 * GIB)).failed["n1"]
    assert failure.kind is FitKind.INSUFFICIENT_SHARE


def test_out_of_band_memory_blocks_a_whole_card() -> None:
    engine = Engine([observed(big_node(cards=2), c1=oob(512))])
    assert engine.filter(whole("one", 1)).feasible == ["n1"]
    assert [s.index for s in engine.place(whole("one", 1)).shares()] == [0]
    failure = engine.filter(whole("two", 2)).failed["n1"]
    assert failure.kind is FitKind.OUT_OF_BAND_MEMORY
    assert (failure.card, failure.out_of_band_mib, failure.unit) == (1, 512, Unit.CARDS)
    assert "not entirely free" in describe(failure)
    with pytest.raises(Unschedulable) as err:
        engine.assign(whole("two", 2), "n1")
    assert err.value.kind is FitKind.OUT_OF_BAND_MEMORY


def test_planning_explains_out_of_band_memory_for_several_containers() -> None:
    from elastic_gpu.core.request import ContainerRequest, PodRequest

    engine = Engine([observed(big_node(), c0=oob(60 * GIB))])
    pod = PodRequest("two", containers=(ContainerRequest.share("a", 100, 10 * GIB),
                                        ContainerRequest.share("b", 100, 15 * GIB)))
    failure = engine.filter(pod).failed["n1"]
    assert failure.kind is FitKind.OUT_OF_BAND_MEMORY
    assert (failure.container, failure.free, failure.requested) == ("a", 5 * GIB, 10 * GIB)


def test_usage_without_out_of_band_memory_changes_nothing() -> None:
    plain = Engine([big_node(cards=2)])
    seen = Engine([observed(big_node(cards=2), c0=CardUsage(70 * GIB, 0, 90))])
    pod = share("a", 300, memory=30 * GIB)
    assert plain.place(pod) == seen.place(pod)


def test_a_new_usage_sample_reaches_fit() -> None:
    engine = Engine([big_node()])
    pod = share("a", 200, memory=30 * GIB)
    assert engine.filter(pod).feasible == ["n1"]
    engine.upsert_node(observed(big_node(), c0=oob(60 * GIB)))
    assert engine.filter(pod).feasible == []
    engine.upsert_node(big_node())
    assert engine.filter(pod).feasible == ["n1"]


def test_no_node_fits_names_out_of_band_memory_in_its_example() -> None:
    engine = Engine([observed(big_node("n1"), c0=oob(60 * GIB)),
                     observed(big_node("n2"), c0=oob(70 * GIB))])
    with pytest.raises(Unschedulable) as err:
        engine.place(share("a", 200, memory=30 * GIB))
    assert err.value.summary is not None
    assert "out of band" in err.value.reason


# ---------------------------------------------------------------- the load-aware option


def hot(sm: int, used: int = 0) -> CardUsage:
    return CardUsage(used_mib=used, out_of_band_mib=0, sm_percent=sm)


LOAD_AWARE = PolicyConfig(load_aware=True)


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "fgd-waste", "frag-exact"])
def test_load_aware_puts_a_new_share_on_the_cool_card_of_a_node(policy: str) -> None:
    node = observed(big_node(cards=2), c0=hot(95), c1=hot(5))
    off = Engine([node], PolicyConfig(card_policy=policy))
    on = Engine([node], PolicyConfig(card_policy=policy, load_aware=True))
    pod = share("a", 300, memory=GIB)
    assert [s.index for s in off.place(pod).shares()] == [0]  # ties: the lowest index
    assert [s.index for s in on.place(pod).shares()] == [1]


def test_load_aware_breaks_utilisation_ties_by_memory_in_use() -> None:
    node = observed(big_node(cards=2), c0=hot(40, used=9 * GIB), c1=hot(40, used=GIB))
    engine = Engine([node], LOAD_AWARE)
    assert [s.index for s in engine.place(share("a", 300)).shares()] == [1]


@pytest.mark.parametrize("hot_node", ["n1", "n2"])
def test_load_aware_puts_a_new_share_on_the_cool_node(hot_node: str) -> None:
    nodes = [observed(big_node(name), c0=hot(90 if name == hot_node else 10))
             for name in ("n1", "n2")]
    cool = "n2" if hot_node == "n1" else "n1"
    for seed in range(6):  # whatever the seeded rank would have chosen
        engine = Engine(nodes, PolicyConfig(node_policy="binpack", load_aware=True), seed=seed)
        assert engine.place(share("a", 300)).node == cool


def test_load_aware_never_overrides_the_policys_score() -> None:
    """Binpack's tightest card wins even when it is the hot one: load only breaks ties."""
    engine = Engine([observed(big_node(cards=2), c0=hot(95), c1=hot(5))], LOAD_AWARE)
    first = share("first", 500)
    on_hot = Assignment("n1", {"main": (CardShare(0, "GPU-n1-0", 500, 0),)})
    engine.allocate(first.key, on_hot, first)
    assert [s.index for s in engine.place(share("b", 300)).shares()] == [0]


def test_load_aware_gives_whole_cards_from_the_coolest() -> None:
    engine = Engine([observed(big_node(cards=3), c0=hot(80), c1=hot(60), c2=hot(0))],
                    LOAD_AWARE)
    assert sorted(s.index for s in engine.place(whole("w", 2)).shares()) == [1, 2]


def test_without_observations_load_aware_places_as_before() -> None:
    nodes = [big_node(f"n{i}", cards=2) for i in range(4)]
    off, on = Engine(nodes, seed=3), Engine(nodes, LOAD_AWARE, seed=3)
    for i in range(12):
        pod = share(f"p{i}", 150 + 50 * (i % 4), memory=GIB)
        a, b = off.place(pod), on.place(pod)
        assert a == b
        off.allocate(pod.key, a, pod)
        on.allocate(pod.key, b, pod)


def test_a_usage_sample_updates_the_arrays_in_place_and_keeps_the_holds() -> None:
    """Agents write a sample per node every period: it must not rebuild the whole layout."""
    engine = Engine([big_node("n1", cards=2), big_node("n2")])
    first = share("a", 300, memory=20 * GIB)
    engine.allocate(first.key, engine.assign(first, "n1"), first)
    lay = engine._layout  # the engine's arrays: what a rebuild would replace
    before = lay.generation
    engine.upsert_node(observed(big_node("n1", cards=2), c0=oob(50 * GIB),
                                c1=CardUsage(40 * GIB, 30 * GIB, 80)))
    assert not lay.stale and lay.generation == before + 1
    assert int(lay.oob_mem[lay.row_of["n1"], 0]) == 50 * GIB
    assert engine.card_usage("n1")[0] == (0, 300, 20 * GIB)  # the hold is still counted
    assert engine.filter(share("b", 100, memory=50 * GIB), ["n1"]).feasible == ["n1"]
    failure = engine.filter(share("c", 100, memory=70 * GIB), ["n1"]).failed["n1"]
    assert (failure.kind, failure.card, failure.free) == (FitKind.OUT_OF_BAND_MEMORY, 1,
                                                          50 * GIB)
    engine.upsert_node(big_node("n1", cards=3))  # a new card: a real change rebuilds
    assert lay.stale
    assert engine.card_usage("n1")[0] == (0, 300, 20 * GIB)
