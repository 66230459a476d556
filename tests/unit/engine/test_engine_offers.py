"""What a card offers: the resource names a pod writes must be served by the card it gets
(vendor, name), and time-sliced replicas are counted as slots, exactly."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.model import Card, MigInstance, Node, offered, serves
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.request import PodRequest, container_request
from elastic_gpu.core.resources import MigProfile

NV = "nvidia.com/gpu"
IX = "iluvatar.com/gpu"
CORE = "elasticgpu.io/gpu-core"
MEM = "elasticgpu.io/gpu-memory"


def offers(gpu: str | None = NV, replicas: int = 1, memory: int = 16384,
           share: bool = True) -> dict[str, int]:
    out = {gpu: replicas} if gpu else {}
    if share:
        out[CORE] = 100
    out[MEM] = memory
    return out


def node(name: str, cards: int = 2, gpu: str | None = NV, replicas: int = 1, model: str = "T4",
         share: bool = True, node_offers: Mapping[str, int] | None = None,
         card_offers: bool = True) -> Node:
    return Node(name, 64000, 1 << 18, tuple(
        Card(i, f"GPU-{name}-{i}", model, 16384,
             offers=offers(gpu, replicas, share=share) if card_offers else None)
        for i in range(cards)), offers=node_offers)


def pod(name: str, **limits: str) -> PodRequest:
    resources = {"limits": {k.replace("__", "/").replace("_", "."): v for k, v in limits.items()}}
    return PodRequest(name, containers=(container_request("main", resources),), cpu_milli=100)


def ask(name: str, resources: Mapping[str, str]) -> PodRequest:
    return PodRequest(name, containers=(container_request("main", {"limits": dict(resources)}),),
                      cpu_milli=100)


# ---------------------------------------------------------------------------- the rule

def test_whole_card_and_mig_names_are_the_vendors_share_names_are_aliases() -> None:
    nv = offers(NV)
    assert offered(nv, NV) == 1 and offered(nv, IX) == 0
    assert offered(nv, "nvidia.com/mig-3g.40gb") == 0
    # every compute name is served by a card selling compute shares under any name
    for name in (CORE, "tencent.com/vcuda-core", "nano-gpu/gpu-percent",
                 "gpushare.provisioner.elasticgpu.io/gpu-core"):
        assert offered(nv, name) == 100
    assert offered(nv, "tencent.com/vcuda-memory") == 16384
    assert offered(offers(NV, share=False), "tencent.com/vcuda-core") == 0
    assert offered(nv, "cpu") == 0
    assert serves(None, (IX,)) and serves(nv, (NV, MEM)) and not serves(nv, (NV, IX))


# ---------------------------------------------------------------------------- vendor

def test_a_pod_naming_a_vendor_goes_only_to_nodes_that_offer_it() -> None:
    engine = Engine([node("nv-0"), node("nv-1"), node("ix", gpu=IX, replicas=4)])
    result = engine.filter(ask("ix-pod", {IX: "1"}))
    assert result.feasible == ["ix"]
    for name in ("nv-0", "nv-1"):
        assert result.failed[name].kind is FitKind.RESOURCE_NOT_OFFERED
        assert result.failed[name].resource == "iluvatar.com/gpu"
        assert "does not offer iluvatar.com/gpu" in describe(result.failed[name])
        why = engine._why_not(int(engine.rows_of([name])[0]), ask("p", {IX: "1"}))
        assert why is not None and why.category == "resource"
    assert engine.filter(ask("nv-pod", {NV: "1"})).feasible == ["nv-0", "nv-1"]
    for i in range(20):
        placed = engine.place(ask(f"nv-{i}", {NV: "1"}) if i < 4 else ask(f"s{i}", {CORE: "10"}))
        assert placed.node != "ix" or i >= 4  # nvidia.com/gpu never lands on the IX node
        engine.allocate(f"p{i}", placed)


def test_no_node_offers_the_name_says_so_with_the_resource_category() -> None:
    engine = Engine([node("nv-0"), node("nv-1")])
    with pytest.raises(Unschedulable) as err:
        engine.place(ask("ix-pod", {IX: "1"}))
    assert err.value.category == "resource"
    assert "iluvatar.com/gpu" in err.value.reason


def test_per_card_a_mig_card_does_not_serve_whole_cards_and_a_plain_one_no_mig() -> None:
    profile = MigProfile(3, 40)
    mig_card = Card(0, "GPU-m-0", "A100", 81920, offers={"nvidia.com/mig-3g.40gb": 2},
                    mig=(MigInstance(profile, "MIG-a", 0), MigInstance(profile, "MIG-b", 4)))
    plain = Card(1, "GPU-m-1", "A100", 81920, offers=offers(NV, memory=81920))
    engine = Engine([Node("mixed", 64000, 1 << 18, (mig_card, plain))])
    whole = engine.place(ask("w", {NV: "1"}))
    assert [s.index for s in whole.shares()] == [1]
    engine.allocate("w", whole)
    assert engine.filter(ask("w2", {NV: "1"})).feasible == []
    mig = engine.place(ask("m", {"nvidia.com/mig-3g.40gb": "2"}))
    assert {s.mig_uuid for s in mig.shares()} == {"MIG-a", "MIG-b"}
    # a share may only go on the card that sells shares: none left once card 1 is taken
    assert engine.filter(ask("s", {CORE: "10"})).feasible == []
    fresh = Engine([Node("mixed", 64000, 1 << 18, (mig_card, plain))])
    assert [s.index for s in fresh.place(ask("s", {CORE: "10"})).shares()] == [1]


def test_per_card_only_the_cards_backing_the_name_count() -> None:
    shares_only = Card(0, "GPU-c-0", "T4", 16384, offers={CORE: 100, MEM: 16384})
    backed = Card(1, "GPU-c-1", "T4", 16384, offers=offers(NV))
    engine = Engine([Node("n", 64000, 1 << 18, (shares_only, backed))])
    first = engine.place(ask("w", {NV: "1"}))
    assert [s.index for s in first.shares()] == [1]
    engine.allocate("w", first)
    # card 0 is entirely free, but it does not back nvidia.com/gpu
    assert engine.filter(ask("w2", {NV: "1"})).feasible == []
    assert engine.filter(ask("two", {NV: "2"})).feasible == []


def test_a_share_alias_needs_a_node_selling_shares() -> None:
    engine = Engine([node("whole-only", share=False), node("shares")])
    result = engine.filter(ask("v", {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-memory": "4"}))
    assert result.feasible == ["shares"]
    assert result.failed["whole-only"].kind is FitKind.RESOURCE_NOT_OFFERED
    assert result.failed["whole-only"].resource == "tencent.com/vcuda-core"


def test_containers_are_checked_one_by_one() -> None:
    # one node: an NVIDIA card; a pod with an IX container and a plain share container
    engine = Engine([node("nv", cards=4)])
    two = PodRequest("two", containers=(
        container_request("a", {"limits": {CORE: "20"}}),
        container_request("b", {"limits": {IX: "1"}})))
    assert engine.filter(two).feasible == []
    assert engine.filter(two).failed["nv"].container == "b"


# ---------------------------------------------------------------------------- node level

def test_node_level_offers_check_cards_of_an_older_agent() -> None:
    old_nv = node("old-nv", card_offers=False, node_offers={NV: 2, CORE: 200, MEM: 32768})
    old_ix = node("old-ix", card_offers=False, node_offers={IX: 8, CORE: 200, MEM: 32768})
    engine = Engine([old_nv, old_ix])
    assert engine.filter(ask("x", {IX: "1"})).feasible == ["old-ix"]
    assert engine.filter(ask("n", {NV: "1"})).feasible == ["old-nv"]
    # the node's 8 replicas over its 2 healthy cards: 4 slots each, counted exactly
    for i in range(8):
        engine.allocate(f"x{i}", engine.assign(ask(f"x{i}", {IX: "1"}), "old-ix"))
    assert engine.filter(ask("x9", {IX: "1"})).feasible == []


def test_cards_say_what_they_offer_within_what_the_node_advertises() -> None:
    # kubelet restarted and the node lost iluvatar.com/gpu: its cards do not serve it
    engine = Engine([node("ix", gpu=IX, replicas=4, node_offers={CORE: 200, MEM: 32768})])
    assert engine.filter(ask("x", {IX: "1"})).feasible == []


def test_nothing_known_serves_everything_as_before() -> None:
    engine = Engine([node("sim", card_offers=False)])
    assert engine.filter(ask("x", {IX: "2"})).feasible == ["sim"]
    placed = engine.place(ask("x", {IX: "2"}))
    assert [s.milli for s in placed.shares()] == [1000, 1000]
    assert all(s.replicas == 0 for s in placed.shares())


# ---------------------------------------------------------------------------- replicas

def ix_engine(card_policy: str = "binpack", cards: int = 2, replicas: int = 4) -> Engine:
    return Engine([node("nv"), node("ix", cards=cards, gpu=IX, replicas=replicas)],
                  PolicyConfig(card_policy=card_policy))


@pytest.mark.parametrize("card_policy", ["binpack", "spread", "random", "topology", "fgd"])
def test_exactly_as_many_replica_pods_as_the_node_advertises(card_policy: str) -> None:
    engine = ix_engine(card_policy)
    for i in range(8):
        assignment = engine.place(ask(f"x{i}", {IX: "1"}))
        assert assignment.node == "ix"
        (share,) = assignment.shares()
        assert share.replicas == 1 and share.milli == 250 and share.memory_mib == 0
        engine.allocate(f"x{i}", assignment)
    assert sorted(u[1] for u in engine.card_usage("ix")) == [1000, 1000]
    with pytest.raises(Unschedulable):
        engine.place(ask("x8", {IX: "1"}))
    failed = engine.filter(ask("x8", {IX: "1"})).failed
    assert failed["ix"].kind is FitKind.INSUFFICIENT_REPLICAS
    assert (failed["ix"].free, failed["ix"].capacity) == (0, 8)
    assert "0 of 8 iluvatar.com/gpu time-sliced replicas are free" in describe(failed["ix"])
    assert failed["nv"].kind is FitKind.RESOURCE_NOT_OFFERED
    engine.release("x3")
    assert engine.filter(ask("x8", {IX: "1"})).feasible == ["ix"]


def test_a_containers_replicas_take_distinct_cards_first_then_stack() -> None:
    engine = ix_engine()
    two = engine.place(ask("two", {IX: "2"}))
    assert sorted((s.index, s.replicas, s.milli) for s in two.shares()) == [(0, 1, 250), (1, 1, 250)]
    engine.allocate("two", two)
    six = engine.place(ask("six", {IX: "6"}))
    assert sorted((s.index, s.replicas) for s in six.shares()) == [(0, 3), (1, 3)]
    engine.allocate("six", six)
    assert engine.filter(ask("one", {IX: "1"})).feasible == []
    assert engine.filter(ask("nine", {IX: "9"})).feasible == []
    # round trip: the annotation says replicas, a restarted scheduler counts them again
    back = Assignment.from_json(six.to_json())
    assert back == six


def test_replicas_and_shares_on_one_card_never_exceed_it() -> None:
    engine = Engine([node("ix", cards=1, gpu=IX, replicas=4)])
    share = engine.place(ask("s", {CORE: "60"}))
    engine.allocate("s", share)
    one = engine.place(ask("r1", {IX: "1"}))  # 600 + 250 <= 1000
    engine.allocate("r1", one)
    assert engine.filter(ask("r2", {IX: "1"})).feasible == []  # 600 + 500 > 1000
    engine.release("s")
    for i in range(3):
        engine.allocate(f"r{i + 2}", engine.place(ask(f"r{i + 2}", {IX: "1"})))
    assert engine.card_usage("ix") == [(0, 1000, 0)]
    assert engine.filter(ask("s2", {CORE: "1"})).feasible == []
    assert engine.filter(ask("w", {CORE: "100"})).feasible == []  # an exclusive whole card


def test_an_exclusive_whole_card_blocks_replicas_and_replicas_block_it() -> None:
    engine = Engine([node("ix", cards=1, gpu=IX, replicas=4)])
    whole = engine.place(ask("w", {CORE: "100"}))
    assert [s.replicas for s in whole.shares()] == [0]
    engine.allocate("w", whole)
    assert engine.filter(ask("r", {IX: "1"})).feasible == []
    engine.release("w")
    engine.allocate("r", engine.place(ask("r", {IX: "1"})))
    assert engine.filter(ask("w", {CORE: "100"})).feasible == []


def test_the_ledger_refuses_more_replicas_than_a_card_has() -> None:
    engine = Engine([node("ix", cards=1, gpu=IX, replicas=64)])
    # 64 replicas of a 1000-milli card cost 15 milli each: 66 would still fit in milli
    for i in range(64):
        engine.allocate(f"r{i}", Assignment("ix", {"main": (CardShare(0, "GPU-ix-0", 15, 0,
                                                                       replicas=1),)}))
    assert engine.filter(ask("r64", {IX: "1"})).feasible == []
    with pytest.raises(Unschedulable, match="time-sliced replicas free"):
        engine.allocate("r64", Assignment("ix", {"main": (CardShare(0, "GPU-ix-0", 15, 0,
                                                                     replicas=1),)}))
    nv = Engine([node("nv", cards=1)])
    with pytest.raises(Unschedulable, match="time-sliced replicas free"):
        nv.allocate("r", Assignment("nv", {"main": (CardShare(0, "GPU-nv-0", 250, 0,
                                                              replicas=1),)}))


def test_why_not_counts_replicas_not_entirely_free_cards() -> None:
    engine = ix_engine()
    for i in range(3):
        engine.allocate(f"x{i}", engine.place(ask(f"x{i}", {IX: "1"})))
    # the reported bug: "0 of 2 cards are entirely free" for a third pod
    assert engine.filter(ask("x3", {IX: "1"})).feasible == ["ix"]
    result = engine.filter(ask("big", {IX: "6"}))
    assert result.failed["ix"].kind is FitKind.INSUFFICIENT_REPLICAS
    assert (result.failed["ix"].free, result.failed["ix"].capacity) == (5, 8)


def test_the_per_name_caches_stay_bounded() -> None:
    engine = Engine([node("nv")])
    for gb in range(1, 700):
        assert engine.filter(ask(f"m{gb}", {f"nvidia.com/mig-1g.{gb}gb": "1"})).feasible == []
    assert len(engine._layout.count_cache) <= 256 and len(engine._layout.names_cache) <= 256
    assert engine.filter(ask("n", {NV: "1"})).feasible == ["nv"]


def test_a_mig_profile_no_node_offers_says_no_node_is_opted_in_to_dynamic_mig() -> None:
    """HAMi's dynamic_mig_example on the default sandbox: no node has the profile and none
    would carve it; the reason says so and how to opt in. With a node opted in (its label),
    the plain sentence stays (the mig-dynamic controller may carve it)."""
    plain = Engine([node("nv-0"), node("nv-1")])
    result = plain.filter(ask("m", {"nvidia.com/mig-1g.10gb": "1"}))
    failure = result.failed["nv-0"]
    assert failure.kind is FitKind.RESOURCE_NOT_OFFERED and failure.no_mig_dynamic
    text = describe(failure)
    assert text.startswith("the node does not offer nvidia.com/mig-1g.10gb (it offers ")
    assert "no node is opted in to dynamic MIG" in text
    assert "elasticgpu.io/mig-dynamic=true" in text and "migDynamic: true" in text
    # a whole-card name no node offers: no MIG hint
    other = describe(plain.filter(ask("ix", {IX: "1"})).failed["nv-0"])
    assert "dynamic MIG" not in other
    opted = Node("nv-dyn", 64000, 1 << 18, node("x").cards,
                 labels={"elasticgpu.io/mig-dynamic": "true"})
    either = Engine([node("nv-0"), opted]).filter(ask("m", {"nvidia.com/mig-1g.10gb": "1"}))
    assert not either.failed["nv-0"].no_mig_dynamic
    assert "dynamic MIG" not in describe(either.failed["nv-0"])
    # a node labelled later (the engine's layout remembers the answer until a node changes)
    plain.upsert_node(Node("nv-1", 64000, 1 << 18, node("nv-1").cards,
                           labels={"elasticgpu.io/mig-dynamic": "true"}))
    assert not plain.filter(ask("m2", {"nvidia.com/mig-1g.10gb": "1"})).failed[
        "nv-0"].no_mig_dynamic
