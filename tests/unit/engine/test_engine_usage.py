"""Observed usage in fit: out-of-band memory is taken off a card's free memory (issue 28)."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import gpu_node, share, whole

from elastic_gpu.core.fit import FitKind, Unit, describe
from elastic_gpu.core.model import Node
from elastic_gpu.core.placement import Engine, Unschedulable
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
