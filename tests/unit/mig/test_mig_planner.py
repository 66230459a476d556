"""The dynamic-MIG planner: free instances first, carving by NVIDIA's placement rules with the
least fragmentation, held instances and whole-held cards never touched, opt-in respected,
HAMi's `vgpu-mode: mig` shares as profiles, merge-back after the cool-down."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_gpu.core.mig.cardstate import (
    CardState,
    Instance,
    MigDemand,
    PlannerConfig,
    WholeDemand,
    card_state,
    hami_mig_demand,
    pod_demand,
)
from elastic_gpu.core.mig.layout import Placement, check_layout, pack
from elastic_gpu.core.mig.planner import plan
from elastic_gpu.core.mig.profiles import mig_model, smallest_profile_for_memory
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

P = MigProfile.parse
A100 = "A100-SXM4-80GB"


def inst(text: str, uuid: str, held: bool = False) -> Instance:
    name, start = text.split("@")
    return Instance(Placement(P(name), int(start)), uuid, held)


def card(uuid: str, *instances: Instance, node: str = "n0", model: str = A100,
         **kw: object) -> CardState:
    return CardState(node, uuid, model, tuple(instances), **kw)  # type: ignore[arg-type]


def names(layout: tuple[Placement, ...]) -> list[str]:
    return sorted(p.name for p in layout)


def test_a_free_instance_of_the_profile_is_matched_and_nothing_changes() -> None:
    cards = [card("g0", inst("1g.10gb@6", "m0")), card("g1")]
    result = plan([MigDemand("p", P("1g.10gb"))], cards)
    assert result.matched == (("p", "m0"),) and result.cards == () and result.unserved == ()


def test_a_whole_card_is_carved_for_the_demand_by_the_placement_rules() -> None:
    cards = [card("g0", held_whole=True), card("g1")]
    result = plan([MigDemand("a", P("3g.40gb")), MigDemand("b", P("1g.10gb"))], cards)
    (one,) = result.cards
    assert one.card == "g1" and not one.merge and set(one.serves) == {"a", "b"}
    model = mig_model(A100)
    assert model is not None and check_layout(model, one.layout) is None
    # the 3g.40gb sits at 4, so the 4g-sized hole at 0..3 keeps a 2g.20gb beside the 1g.10gb
    assert Placement(P("3g.40gb"), 4) in one.layout


def test_carved_cards_are_used_before_a_whole_card_is_carved() -> None:
    cards = [card("g0"), card("g1", inst("3g.40gb@4", "m0", held=True))]
    result = plan([MigDemand("a", P("2g.20gb"))], cards)
    (one,) = result.cards
    assert one.card == "g1" and one.destroy == ()
    assert names(one.layout) == ["2g.20gb@0", "3g.40gb@4"] or \
        names(one.layout) == ["2g.20gb@2", "3g.40gb@4"]


def test_best_fit_fills_the_fuller_card() -> None:
    cards = [card("g0", inst("4g.40gb@0", "a", held=True)),
             card("g1", inst("1g.10gb@6", "b", held=True))]
    result = plan([MigDemand("x", P("1g.10gb"))], cards)
    (one,) = result.cards
    assert one.card == "g0"


def test_held_instances_are_never_moved_or_destroyed() -> None:
    held = inst("2g.20gb@2", "h", held=True)
    cards = [card("g0", held, inst("1g.10gb@0", "f0"), inst("1g.10gb@1", "f1"))]
    result = plan([MigDemand("big", P("4g.40gb")), MigDemand("mid", P("3g.40gb"))], cards)
    for change in result.cards:
        assert held.placement in change.layout
        assert all(d.uuid != "h" for d in change.destroy)
    # a 4g.40gb needs slots 0..3 where the held 2g.20gb sits: it waits
    assert "big" in result.unserved
    # the 3g.40gb fits at 4 beside everything as it is
    assert "mid" not in result.unserved


def test_free_instances_are_destroyed_only_when_needed_and_fewest() -> None:
    cards = [card("g0", inst("1g.10gb@0", "f0"), inst("1g.10gb@4", "f4"),
                  inst("1g.10gb@6", "f6", held=True))]
    result = plan([MigDemand("x", P("3g.40gb"))], cards)
    (one,) = result.cards
    model = mig_model(A100)
    assert model is not None and check_layout(model, one.layout) is None
    # the 3g.40gb goes to 0..3: f0 moves (or goes), f4 and the held f6 stay
    assert Placement(P("3g.40gb"), 0) in one.layout
    assert {d.uuid for d in one.destroy} == {"f0"}
    assert Placement(P("1g.10gb"), 6) in one.layout and Placement(P("1g.10gb"), 4) in one.layout


def test_a_card_held_whole_or_not_opted_in_or_unknown_is_never_changed() -> None:
    cards = [card("g0", held_whole=True), card("g1", opted_in=False),
             card("g2", model="Tesla-T4"), card("g3", healthy=False)]
    result = plan([MigDemand("x", P("1g.10gb"))], cards)
    assert result.cards == () and result.unserved == ("x",)


def test_demand_keeps_to_its_nodes_and_models() -> None:
    cards = [card("g0", node="n0"), card("g1", node="n1"),
             card("g2", node="n2", model="H200-141GB")]
    result = plan([MigDemand("x", P("1g.10gb"), nodes=frozenset({"n1"}))], cards)
    assert [c.card for c in result.cards] == ["g1"]
    result = plan([MigDemand("y", P("1g.18gb"))], cards)    # only the H200 has the profile
    assert [c.card for c in result.cards] == ["g2"]
    result = plan([MigDemand("z", P("1g.10gb"), models=frozenset({"A30-24GB"}))], cards)
    assert result.cards == () and result.unserved == ("z",)


@pytest.mark.parametrize(("memory_mib", "model", "profile"), [
    (4000, "A100-SXM4-40GB", "1g.5gb"),
    (5 * 1024 + 1, "A100-SXM4-40GB", "1g.10gb"),
    (15000, "A100-SXM4-40GB", "3g.20gb"),
    (8000, A100, "1g.10gb"),
    (30000, A100, "3g.40gb"),
    (50000, "NVIDIA H100 80GB HBM3", "7g.80gb"),
    (20000, "H200-141GB", "1g.35gb"),
    (7000, "A30-24GB", "2g.12gb"),
])
def test_hami_mig_shares_become_the_smallest_profile_with_the_memory(
        memory_mib: int, model: str, profile: str) -> None:
    assert smallest_profile_for_memory(memory_mib, model) == P(profile)
    demand = hami_mig_demand("h", memory_mib, model)
    assert demand is not None and demand.profile == P(profile)


def test_hami_share_too_large_or_unknown_model_is_no_demand() -> None:
    assert smallest_profile_for_memory(90000, A100) is None
    assert hami_mig_demand("h", 1000, "Tesla-T4") is None


def test_merge_back_waits_for_the_cool_down_and_never_takes_a_held_card() -> None:
    cfg = PlannerConfig(merge_cooldown_s=300)
    cards = [card("g0", held_whole=True),
             card("g1", inst("3g.40gb@4", "a"), changed_at=1000.0),
             card("g2", inst("3g.40gb@4", "b", held=True), changed_at=0.0)]
    early = plan([], cards, [WholeDemand("w")], now=1100.0, config=cfg)
    assert early.cards == () and early.unserved == ("w",)
    late = plan([], cards, [WholeDemand("w")], now=1300.0, config=cfg)
    (one,) = late.cards
    assert one.card == "g1" and one.merge and one.layout == () and one.serves == ("w",)
    assert [d.uuid for d in one.destroy] == ["a"]


def test_merge_back_only_where_the_whole_demand_then_fits_on_one_node() -> None:
    cards = [card("g0", node="n0"), card("g1", inst("1g.10gb@6", "a"), node="n0"),
             card("g2", inst("1g.10gb@6", "b"), node="n1")]
    result = plan([], cards, [WholeDemand("w", cards=3)])
    assert result.cards == () and result.unserved == ("w",)   # n0: 2 at most, n1: 1
    result = plan([], cards, [WholeDemand("w", cards=2)])
    assert [(c.card, c.merge) for c in result.cards] == [("g1", True)]
    assert result.reserved == (("w", "g0"),)


def test_whole_demand_keeps_its_cards_from_being_carved() -> None:
    cards = [card("g0"), card("g1")]
    result = plan([MigDemand("m1", P("1g.10gb")), MigDemand("m2", P("7g.80gb"))], cards,
                  [WholeDemand("w", cards=1)])
    # one card is reserved for the whole-card pod; the 7g.80gb takes the other and the
    # 1g.10gb finds no room
    assert [c.card for c in result.cards] == ["g1"] or [c.card for c in result.cards] == ["g0"]
    assert result.unserved == ("m1",)


def test_mig_demand_on_carved_cards_comes_before_merge_back() -> None:
    cards = [card("g0", inst("3g.40gb@4", "a"))]
    result = plan([MigDemand("m", P("3g.40gb"))], cards, [WholeDemand("w")])
    assert result.matched == (("m", "a"),) and result.cards == ()
    assert result.unserved == ("w",)


def test_max_cards_per_round() -> None:
    cards = [card("g0"), card("g1"), card("g2")]
    demand = [MigDemand(f"d{k}", P("7g.80gb")) for k in range(3)]
    result = plan(demand, cards, config=PlannerConfig(max_cards_per_round=2))
    assert len(result.cards) == 2 and len(result.unserved) == 1


def test_card_state_from_a_core_card() -> None:
    c = Card(0, "GPU-0", A100, 81920, mig=(
        MigInstance(P("3g.40gb"), "m0", 4), MigInstance(P("1g.10gb"), "m1", 0),
        MigInstance(P("1g.10gb"), "m2", 1, Health.UNHEALTHY)))
    state = card_state("n0", c, {"m0"})
    assert [i.held for i in state.instances] == [True, False, True]   # unhealthy counts held
    assert [i.uuid for i in state.free] == ["m1"] and state.carved and state.changeable


def test_plans_are_deterministic_and_every_layout_valid() -> None:
    model = mig_model(A100)
    assert model is not None
    cards = [card(f"g{k}", node=f"n{k % 2}") for k in range(4)]
    demand = [MigDemand(f"d{k}", P(p)) for k, p in enumerate(
        ["1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb", "4g.40gb", "1g.10gb", "2g.20gb"])]
    first = plan(demand, cards)
    assert first == plan(demand, cards)
    assert first.unserved == ()
    for change in first.cards:
        assert check_layout(model, change.layout) is None


@pytest.mark.parametrize("model", ["A30-24GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100-80GB",
                                   "H200-141GB"])
def test_every_profile_of_every_model_is_carved_at_an_allowed_start(model: str) -> None:
    table = mig_model(model)
    assert table is not None
    for row in table.profiles:
        demand = [MigDemand(f"d{k}", row.profile) for k in range(row.max_instances)]
        result = plan(demand, [card("g0", model=model)])
        (one,) = result.cards
        assert result.unserved == () and len(one.create) == row.max_instances
        assert check_layout(table, one.layout) is None
        assert all(p.start in row.starts for p in one.layout)
        # one more than a card holds waits
        more = plan([*demand, MigDemand("x", row.profile)], [card("g0", model=model)])
        assert more.unserved == ("x",)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_rounds_never_touch_a_held_instance(data: st.DataObject) -> None:
    table = mig_model(A100)
    assert table is not None
    plain = [r for r in table.profiles if not r.profile.extra]
    cards = []
    for k in range(3):
        wanted = data.draw(st.lists(st.sampled_from(plain), max_size=4), label=f"layout{k}")
        placed = pack(table, [r.profile for r in wanted]) or ()
        held = data.draw(st.lists(st.booleans(), min_size=len(placed), max_size=len(placed)))
        cards.append(card(f"g{k}", *(Instance(p, f"m{k}-{j}", h)
                                     for j, (p, h) in enumerate(zip(placed, held, strict=True))),
                          changed_at=data.draw(st.sampled_from([None, 0.0, 900.0]))))
    demand = [MigDemand(f"d{j}", r.profile) for j, r in enumerate(
        data.draw(st.lists(st.sampled_from(plain), max_size=5), label="demand"))]
    whole = [WholeDemand(f"w{j}") for j in range(data.draw(st.integers(0, 2)))]
    result = plan(demand, cards, whole, now=1000.0)
    by_card = {c.uuid: c for c in cards}
    for change in result.cards:
        before = by_card[change.card]
        assert check_layout(table, change.layout) is None
        for i in before.held:
            assert i.placement in change.layout and i not in change.destroy
        if change.merge:
            assert not before.held and change.layout == ()
            assert before.changed_at is None or 1000.0 - before.changed_at >= 300
    served = {k for c in result.cards for k in c.serves} | \
        {k for k, _ in (*result.matched, *result.reserved)}
    assert served | set(result.unserved) == {d.key for d in demand} | {w.key for w in whole}


def test_a_card_in_mig_mode_with_no_instance_is_no_whole_card() -> None:
    empty = card("g0", mig_mode=True)
    assert empty.carved and not empty.instances
    # whole-card demand: merged back (MIG mode off), not taken as a free whole card
    result = plan([], [empty], [WholeDemand("w")])
    (one,) = result.cards
    assert one.merge and one.layout == () and one.destroy == () and result.reserved == ()
    # MIG demand: carved as a card already in MIG mode, before any whole card
    result = plan([MigDemand("m", P("1g.10gb"))], [card("g1"), card("g9", mig_mode=True)])
    assert [c.card for c in result.cards] == ["g9"]


def test_a_pods_request_as_demand() -> None:
    from elastic_gpu.core.request import pod_request_from_manifest

    def pod(limits: dict[str, str], *more: dict[str, str]) -> dict[str, object]:
        containers = [{"name": f"c{k}", "resources": {"limits": lim}}
                      for k, lim in enumerate((limits, *more))]
        return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers}}

    mig, whole = pod_demand(pod_request_from_manifest(pod({"nvidia.com/mig-3g.40gb": "2"},
                                                          {"nvidia.com/mig-1g.10gb": "1"})))
    assert [(d.key, d.profile.name) for d in mig] == [
        ("ns/p", "3g.40gb"), ("ns/p#1", "3g.40gb"), ("ns/p#2", "1g.10gb")]
    assert whole == []
    mig, whole = pod_demand(pod_request_from_manifest(pod({"nvidia.com/gpu": "2"},
                                                          {"nvidia.com/gpu": "1"})),
                            frozenset({"n0"}))
    assert mig == [] and whole == [WholeDemand("ns/p", 3, frozenset({"n0"}))]


def test_a_group_s_instances_are_carved_on_distinct_cards_of_one_node() -> None:
    """HAMi's `nvidia.com/gpu: 2` under vgpu-mode mig (`ContainerRequest.distinct`): the two
    1g.10gb instances are carved on two cards of one node; without a group, one card takes
    both (our own `nvidia.com/mig-1g.10gb: 2`)."""
    cards = [card("g0", node="n0"), card("g1", node="n0"), card("g2", node="n1")]
    grouped = [MigDemand("p", P("1g.10gb"), group="ns/p/main"),
               MigDemand("p#1", P("1g.10gb"), group="ns/p/main")]
    result = plan(grouped, cards)
    assert result.unserved == ()
    assert sorted((c.node, c.card) for c in result.cards) == [("n0", "g0"), ("n0", "g1")]
    (one,) = plan([MigDemand("p", P("1g.10gb")), MigDemand("p#1", P("1g.10gb"))], cards).cards
    assert set(one.serves) == {"p", "p#1"}


def test_a_group_s_free_instances_are_matched_one_per_card() -> None:
    cards = [card("g0", inst("1g.10gb@5", "a"), inst("1g.10gb@6", "b")), card("g1")]
    grouped = [MigDemand("p", P("1g.10gb"), group="g"), MigDemand("p#1", P("1g.10gb"), group="g")]
    result = plan(grouped, cards)
    assert len(result.matched) == 1 and result.matched[0][1] in {"a", "b"}
    (carved,) = result.cards
    assert carved.card == "g1" and carved.serves == ("p#1",)
    # a lone node with one card has no second card: the group waits, nothing carved for it
    alone = plan(grouped, [card("g0")])
    assert alone.unserved == ("p", "p#1") and alone.cards == ()


def test_pod_demand_groups_a_distinct_container_s_instances() -> None:
    c = ContainerRequest("main", RequestKind.MIG, 2, 0, 0, P("1g.10gb"))
    mig, _ = pod_demand(PodRequest("p", "ns", containers=(replace(c, distinct=True),)))
    assert [(d.key, d.group) for d in mig] == [("ns/p", "ns/p/main"), ("ns/p#1", "ns/p/main")]
    mig, _ = pod_demand(PodRequest("p", "ns", containers=(c,)))
    assert {d.group for d in mig} == {None}


def test_a_group_goes_to_a_node_with_a_card_for_each_of_it() -> None:
    """A node of one card cannot take two instances on distinct cards: not even its free
    instance is matched for the group's first, which would leave the second waiting there."""
    grouped = [MigDemand("p", P("1g.10gb"), group="g"), MigDemand("p#1", P("1g.10gb"), group="g")]
    for small in (card("g0", node="n0"), card("g0", inst("1g.10gb@6", "free"), node="n0")):
        result = plan(grouped, [small, card("g1", node="n1"), card("g2", node="n1")])
        assert result.unserved == () and result.matched == ()
        assert sorted(c.card for c in result.cards) == ["g1", "g2"]


def test_alternatives_the_first_free_then_the_first_that_can_be_carved() -> None:
    # free: a later choice's free instance serves before the first choice is carved
    cards = [card("g0", inst("1g.10gb@6", "m0")), card("g1")]
    choice = MigDemand("p", P("3g.40gb"), alternatives=(P("1g.10gb"),))
    result = plan([choice], cards)
    assert result.matched == (("p", "m0"),) and result.cards == ()
    # carved: a first choice the card's model lacks (H200's 3g.71gb) gives way to the next
    far = MigDemand("q", P("3g.71gb"), alternatives=(P("2g.20gb"), P("1g.10gb")))
    (one,) = plan([far], [card("g1")]).cards
    assert names(one.create) == ["2g.20gb@4"] and one.serves == ("q",)
    # in the order listed: the first choice on a whole card, not the second beside a carved one
    carved = card("g0", inst("3g.40gb@4", "m1", held=True))
    first = MigDemand("s", P("4g.40gb"), alternatives=(P("1g.10gb"),))
    blocked = card("g0", inst("3g.40gb@0", "m1", held=True), inst("1g.10gb@6", "m2", held=True))
    (one,) = plan([first], [blocked, card("g1")]).cards
    assert (one.card, names(one.create)) == ("g1", ["4g.40gb@0"])
    (one,) = plan([first], [carved, card("g1")]).cards  # beside, when it fits there
    assert (one.card, names(one.create)) == ("g0", ["4g.40gb@0"])
    # nothing any choice serves: it waits
    assert plan([MigDemand("r", P("3g.71gb"))], [card("g1")]).unserved == ("r",)


def test_a_free_instance_is_matched_in_the_order_core_mig_pick_takes_them() -> None:
    """Step 1 matches the instance the scheduler would take (`core.mig.pick`): a partly held
    card before one nothing holds, though the latter is full (no headroom), then the fullest."""
    full = card("g0", *(inst(f"1g.10gb@{s}", f"f{s}") for s in range(7)), node="n0")
    partly = card("g1", inst("1g.10gb@0", "h0", held=True), inst("1g.10gb@1", "h1"),
                  inst("1g.10gb@2", "h2"), node="n1")
    fuller = card("g2", inst("1g.10gb@0", "k0", held=True), inst("1g.10gb@1", "k1"),
                  node="n2")
    result = plan([MigDemand("p", P("1g.10gb"))], [full, partly])
    assert result.matched == (("p", "h1"),) and result.cards == ()
    result = plan([MigDemand("p", P("1g.10gb")), MigDemand("q", P("1g.10gb"))],
                  [full, partly, fuller])
    assert result.matched == (("p", "k1"), ("q", "h1"))
