"""Multi-card shares: N shares of one shape on N distinct cards of one node (issue 40).

Written `elasticgpu.io/gpu: N` beside a one-card share; fit counts the cards with room, the card
tier picks N distinct cards (`CardPolicy.pick_shares`), the ledger holds one share per card, and
FGD's measure scores runs of N cards ranked by free room.
"""

from __future__ import annotations

import random

import pytest
from engine_helpers import gpu_node, share

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitKind, Unschedulable, describe
from elastic_gpu.core.gpuview import PodHold, build_view
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.policies import CARD_POLICIES
from elastic_gpu.core.policies.node import free_after, share_runs_after
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind, container_request
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.core.workload import TaskShape


def multi(name: str, milli: int, memory: int = 0, cards: int = 2, cpu: int = 1000) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest.share("main", milli, memory, cards),),
                      cpu_milli=cpu, memory_mib=1024)


# ------------------------------------------------------------------ the dialect


def test_gpu_count_beside_a_share_is_that_share_on_n_cards() -> None:
    got = container_request("main", {"limits": {"elasticgpu.io/gpu": "2",
                                                "elasticgpu.io/gpu-core": "30",
                                                "elasticgpu.io/gpu-memory": "8192"}})
    assert got == ContainerRequest("main", RequestKind.SHARE, 2, 300, 8192, None, (
        "elasticgpu.io/gpu", "elasticgpu.io/gpu-core", "elasticgpu.io/gpu-memory"))
    assert got.multi_share and got.total_milli == 600
    assert ContainerRequest.share("main", 300, 8192, cards=2) == ContainerRequest(
        "main", RequestKind.SHARE, 2, 300, 8192)
    assert ContainerRequest.share("main", 300).cards == 1


def test_other_compute_aliases_and_tflops_make_multi_shares_too() -> None:
    alias = container_request("c", {"limits": {"elasticgpu.io/gpu": "3", "nano-gpu/gpu-percent": "25"}})
    assert (alias.kind, alias.cards, alias.compute_milli) == (RequestKind.SHARE, 3, 250)
    tflops = container_request("c", {"limits": {"elasticgpu.io/gpu": "2",
                                                "elasticgpu.io/gpu-tflops": "50"}})
    assert (tflops.kind, tflops.cards, tflops.tflops) == (RequestKind.SHARE, 2, 50)
    assert tflops.most_milli == 2 * ContainerRequest("c", RequestKind.SHARE, 1, 0, 0, None, (),
                                                     50).most_milli


def test_without_a_share_the_count_stays_whole_cards() -> None:
    for limits in ({"elasticgpu.io/gpu": "2"},
                   {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-memory": "8192"}):
        got = container_request("c", {"limits": limits})
        assert (got.kind, got.cards) == (RequestKind.WHOLE, 2)


def test_a_vendor_count_or_whole_compute_beside_the_count_stays_refused() -> None:
    for limits in ({"nvidia.com/gpu": "2", "elasticgpu.io/gpu-core": "30"},
                   {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-core": "200"}):
        with pytest.raises(ResourceError, match="whole cards or a compute share"):
            container_request("c", {"limits": limits})


# ------------------------------------------------------------------ fit and its sentence


def busy_engine(policy: str = "binpack", check_host: bool = True) -> Engine:
    """One node of 4 cards, 3 of them 80% used."""
    engine = Engine([gpu_node("n1", 4)], PolicyConfig(node_policy=policy,
                                                       check_host_resources=check_host))
    for i in range(3):
        engine.allocate(f"x{i}", Assignment("n1", {"main": (CardShare(i, f"GPU-n1-{i}", 800, 0),)}))
    return engine


@pytest.mark.parametrize("check_host", [True, False])
def test_too_few_cards_with_room_is_one_structured_failure(check_host: bool) -> None:
    engine = busy_engine(check_host=check_host)
    pod = multi("q", 300, 8192, cards=3)
    failure = engine.filter(pod).failed["n1"]
    assert (failure.kind, failure.requested, failure.free, failure.capacity) == (
        FitKind.INSUFFICIENT_SHARE, 3, 1, 4)
    sentence = "1/4 cards have 30% compute and 8192 MiB free, container main needs 3 such cards"
    assert describe(failure) == sentence
    with pytest.raises(Unschedulable) as raised:
        engine.place(pod)
    assert describe(raised.value.failure) == sentence
    with pytest.raises(Unschedulable):
        engine.assign(pod, "n1")


def test_a_one_card_share_keeps_its_sentence() -> None:
    engine = busy_engine()
    failure = engine.filter(share("s", 300, 20000)).failed["n1"]
    assert describe(failure) == "0/4 cards have 30% compute and 20000 MiB free (container main)"


def test_fit_counts_distinct_cards_not_room() -> None:
    """Two shares of 30% fit on one free card's compute, but a multi-card share needs two cards."""
    engine = busy_engine()
    assert engine.filter(multi("a", 300, cards=1)).feasible == ["n1"]
    assert engine.filter(multi("b", 300, cards=2)).feasible == []
    assert engine.filter(multi("c", 200, cards=4)).feasible == ["n1"]


def test_multi_share_with_another_container_is_planned() -> None:
    engine = Engine([gpu_node("n1", 4)])
    pod = PodRequest("p", containers=(ContainerRequest.whole("a", 2),
                                      ContainerRequest.share("b", 400, 0, 2)))
    placed = engine.place(pod)
    cards_a = {s.index for s in placed.containers["a"]}
    cards_b = {s.index for s in placed.containers["b"]}
    assert len(cards_a) == 2 and len(cards_b) == 2 and not cards_a & cards_b
    three = PodRequest("q", containers=(ContainerRequest.whole("a", 2),
                                        ContainerRequest.share("b", 400, 0, 3)))
    assert Engine([gpu_node("n1", 4)]).filter(three).feasible == []


# ------------------------------------------------------------------ card tier and ledger


@pytest.mark.parametrize("card_policy", sorted(CARD_POLICIES))
def test_every_card_policy_picks_n_distinct_cards_with_room(card_policy: str) -> None:
    engine = busy_engine()
    engine.release("x2")  # cards 2 and 3 free; 0 and 1 have 200 milli
    placed = engine.assign(multi("p", 150, 1000, cards=3), "n1", card_policy=card_policy)
    shares = placed.containers["main"]
    assert len({s.index for s in shares}) == 3
    assert all((s.milli, s.memory_mib) == (150, 1000) for s in shares)
    assert [s.index for s in shares] == sorted(s.index for s in shares)


def test_binpack_takes_the_tightest_cards_and_the_ledger_holds_each_share() -> None:
    engine = busy_engine()
    engine.release("x2")
    placed = engine.assign(multi("p", 150, 1000, cards=2), "n1", card_policy="binpack")
    assert [s.index for s in placed.containers["main"]] == [0, 1]
    engine.allocate("p", placed)
    usage = {index: (milli, mem) for index, milli, mem in engine.card_usage("n1")}
    assert usage[0] == (950, 1000) and usage[1] == (950, 1000) and usage[2] == (0, 0)
    engine.release("p")
    assert {i: m for i, m, _ in engine.card_usage("n1")}[0] == 800


def test_fgd_card_tier_takes_the_run_that_fragments_least() -> None:
    """With 200 milli left on cards 0-1 and two free cards, FGD's card tier keeps the free
    cards whole when a 20% share on two cards fits the fragments (the workload is mostly whole
    cards and 20% shares)."""
    engine = busy_engine("fgd")
    engine.release("x2")
    placed = engine.assign(multi("p", 200, 0, cards=2), "n1")
    assert [s.index for s in placed.containers["main"]] == [0, 1]


# ------------------------------------------------------------------ FGD's measure generalised


def test_free_after_of_a_multi_share_is_each_run_of_n_by_free_room() -> None:
    task = TaskShape(1000, 300, 2)
    free = (1000, 200, 500, 300, 1000)
    runs = share_runs_after(task, free)
    # cards with room by free room: 0 (1000), 4 (1000), 2 (500), 3 (300)
    assert [after for _, after in runs] == [(700, 200, 500, 300, 700),
                                            (1000, 200, 200, 300, 700),
                                            (1000, 200, 200, 0, 1000)]
    assert free_after(task, free) == runs
    assert free_after(TaskShape(1000, 300, 5), free) == []


@pytest.mark.parametrize("policy", ["fgd", "fgdx", "fgdx-auto"])
def test_fgd_scores_nodes_for_multi_shares(policy: str) -> None:
    """A node that can take the share scores above 0 (before, FGD had no state for a fraction
    of several cards and scored every node 0)."""
    engine = Engine([gpu_node("a", 4), gpu_node("b", 1)], PolicyConfig(node_policy=policy))
    scores = engine.score(multi("p", 300, cards=2), ["a", "b"])
    assert list(scores) == ["a"] and scores["a"] > 0


def test_a_replay_of_mixed_pods_never_overcommits_a_card() -> None:
    rng = random.Random(3)
    engine = Engine([gpu_node(f"n{i}", rng.choice((2, 4, 8))) for i in range(6)],
                    PolicyConfig(node_policy="fgdx-auto"), seed=1)
    for i in range(120):
        cards = rng.choice((1, 2, 3, 4))
        pod = multi(f"p{i}", rng.choice((100, 250, 500, 700)), 1000, cards)
        try:
            placed = engine.place(pod)
        except Unschedulable:
            continue
        engine.allocate(pod.key, placed, pod)
        assert len({s.index for s in placed.containers["main"]}) == cards
    for node in engine.nodes():
        assert all(milli <= 1000 for _, milli, _ in engine.card_usage(node))


def test_the_count_name_needs_no_card_offering_it() -> None:
    """Cards that publish what they back (an agent's GPUDevices) serve a multi-card share by
    its compute and memory names: `elasticgpu.io/gpu` counts the shares there, no device."""
    offers = {"nvidia.com/gpu": 1, "elasticgpu.io/gpu-core": 100, "elasticgpu.io/gpu-memory": 16000}
    node = Node("n1", 32000, 65536, tuple(Card(i, f"GPU-{i}", "T4", 16000, offers=offers)
                                          for i in range(2)))
    request = container_request("main", {"limits": {"elasticgpu.io/gpu": "2",
                                                    "elasticgpu.io/gpu-core": "30",
                                                    "elasticgpu.io/gpu-memory": "4096"}})
    assert request.served_names == ("elasticgpu.io/gpu-core", "elasticgpu.io/gpu-memory")
    engine = Engine([node])
    assert engine.filter(PodRequest("p", containers=(request,))).feasible == ["n1"]
    whole = container_request("main", {"limits": {"elasticgpu.io/gpu": "2"}})
    failure = engine.filter(PodRequest("w", containers=(whole,))).failed["n1"]
    assert failure.kind is FitKind.RESOURCE_NOT_OFFERED


def test_egpu_top_shows_a_multi_share_pod_on_each_of_its_cards() -> None:
    engine = Engine([gpu_node("n1", 4)])
    placed = engine.place(multi("p", 300, 4096, cards=3))
    view = build_view([engine.node("n1")], [PodHold("team-a", "p", placed)])
    holding = [c for c in view.nodes[0].cards if c.holders]
    assert len(holding) == 3
    for card in holding:
        assert [(h.name, h.milli) for h in card.holders] == [("team-a/p", 300)]
        assert card.used_mib == 4096
