"""The mig-dynamic controller's pure half (`core.mig.dynamic`) and the fence as the extender
sees it: a GPUDevice with `status.fence` is a `Health.FENCED` card, which the engine places
nothing on and explains with `FitKind.CARD_FENCED`; the ledger's holdings split into held
instances and held cards; a card whose MigLayout is being applied shows as its target,
unchangeable, so its instances to come serve the demand that waits instead of a second carve."""

from __future__ import annotations

from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.mig.cardstate import MigDemand, WholeDemand
from elastic_gpu.core.mig.dynamic import card_states, in_flight, layout_of, ledger_holds
from elastic_gpu.core.mig.planner import plan
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.request import ContainerRequest, PodRequest
from elastic_gpu.core.resources import MigProfile

A100 = "A100-SXM4-80GB"
P3 = MigProfile.parse("3g.40gb")
P1 = MigProfile.parse("1g.10gb")


def node(*cards: Card, name: str = "n0") -> Node:
    return Node(name, 64_000, 256_000, cards)


def card(i: int, *mig: MigInstance, health: Health = Health.HEALTHY) -> Card:
    return Card(i, f"GPU-{i}", A100, 81920, health=health, mig=mig)


def test_a_fenced_gpudevice_is_a_fenced_card_and_the_engine_says_so() -> None:
    obj = gd.card_to_object("n0", card(0))
    obj["status"]["fence"] = "MigLayout n0.gpu-0 (generation 1): layout changing"
    _, read = gd.card_from_object(obj)
    assert read.health is Health.FENCED and not read.healthy
    obj["status"]["fence"] = None
    assert gd.card_from_object(obj)[1].health is Health.HEALTHY
    engine = Engine([node(card(0, health=Health.FENCED))])
    pod = PodRequest("p", containers=(ContainerRequest.whole("main", 1),))
    failure = engine.filter(pod).failed["n0"]
    assert failure.kind is FitKind.CARD_FENCED and failure.requested == 1
    assert "fenced while their MIG layout changes" in describe(failure)


def test_ledger_holds_splits_instances_from_cards() -> None:
    whole = Assignment("n0", {"main": (CardShare(0, "GPU-0", 1000, 81920),)})
    inst = Assignment("n0", {"main": (CardShare(1, "GPU-1", 0, 40960, "3g.40gb", "MIG-a"),)})
    assert ledger_holds([("ml/a", whole), ("ml/b", inst)]) == (frozenset({"MIG-a"}),
                                                               frozenset({"GPU-0"}))


def test_in_flight() -> None:
    assert in_flight(2, 1, "Applied")
    assert in_flight(1, 1, "Fencing")
    assert not in_flight(1, 1, "Applied") and not in_flight(1, 1, "Blocked")


def test_a_layout_being_applied_serves_the_demand_instead_of_a_second_carve() -> None:
    nodes = [node(card(0), card(1))]
    demand = [MigDemand("ml/m", P3)]
    first = plan(demand, card_states(nodes, {"n0"}, frozenset(), frozenset(), {}, {}))
    (carve,) = first.cards
    target = layout_of(carve)
    assert target == [Placed(4, P3)]
    again = plan(demand, card_states(nodes, {"n0"}, frozenset(), frozenset(),
                                     {carve.card: target}, {}))
    assert again.cards == () and [key for key, _ in again.matched] == ["ml/m"]


def test_only_opted_in_nodes_change_and_held_cards_never() -> None:
    nodes = [node(card(0), card(1)), node(Card(0, "GPU-x", A100, 81920), name="n1")]
    states = card_states(nodes, {"n0"}, frozenset(), frozenset({"GPU-0"}), {}, {})
    changeable = {s.uuid for s in states if s.changeable}
    assert changeable == {"GPU-1"}
    decided = plan([MigDemand("ml/a", P1), MigDemand("ml/b", P3)], states)
    assert {c.card for c in decided.cards} == {"GPU-1"}


def test_a_fenced_card_without_our_layout_is_left_alone() -> None:
    nodes = [node(card(0, MigInstance(P3, "MIG-a", 4), health=Health.FENCED))]
    (state,) = card_states(nodes, {"n0"}, frozenset(), frozenset(), {}, {})
    assert not state.changeable
    assert plan([], [state], [WholeDemand("ml/w", 1)], now=1e9).cards == ()
