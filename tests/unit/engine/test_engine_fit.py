"""Fit and card choice for every request kind."""

from __future__ import annotations

import pickle

import pytest
from engine_helpers import cpu_only, gpu_node, mig, mig_node, nvlink_node, share, whole

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.claims.blocks import BlockKind, ClaimBlock
from elastic_gpu.core.fit import FitFailure, FitKind, Unit, describe
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile


def test_share_goes_to_a_card_with_room_and_is_charged() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = share("a", 600, memory=4000)
    assignment = engine.place(pod)
    engine.allocate(pod.key, assignment, pod)
    (only,) = list(assignment.shares())
    assert (only.milli, only.memory_mib) == (600, 4000)
    usage = dict((i, (m, mem)) for i, m, mem in engine.card_usage("n1"))
    assert usage[only.index] == (600, 4000)
    assert engine.host_usage("n1") == (1000, 1024)


def test_share_never_exceeds_a_card() -> None:
    engine = Engine([gpu_node("n1", cards=1)])
    first = share("a", 600)
    engine.allocate(first.key, engine.place(first), first)
    with pytest.raises(Unschedulable) as err:
        engine.place(share("b", 500))
    assert err.value.category == "gpu"
    assert "50% compute" in err.value.reason


def test_card_memory_limits_shares() -> None:
    engine = Engine([gpu_node("n1", cards=1, memory=8000)])
    first = share("a", 100, memory=6000)
    engine.allocate(first.key, engine.place(first), first)
    assert engine.filter(share("b", 100, memory=3000)).feasible == []
    assert engine.filter(share("c", 100, memory=2000)).feasible == ["n1"]


def test_whole_cards_take_only_untouched_cards() -> None:
    engine = Engine([gpu_node("n1", cards=3)])
    small = share("a", 100)
    engine.allocate(small.key, engine.place(small), small)
    pod = whole("w", 2)
    assignment = engine.place(pod)
    used = {s.index for s in assignment.shares()}
    assert len(used) == 2 and next(iter(small_cards(engine, small))) not in used
    engine.allocate(pod.key, assignment, pod)
    assert engine.filter(whole("w2", 1)).feasible == []


def small_cards(engine: Engine, pod: PodRequest) -> set[int]:
    assignment = engine.allocation(pod.key)
    assert assignment is not None
    return {s.index for s in assignment.shares()}


def test_unhealthy_cards_are_never_chosen() -> None:
    engine = Engine([gpu_node("n1", cards=2, unhealthy=(0,))])
    for i in range(3):
        pod = share(f"p{i}", 300)
        assignment = engine.place(pod)
        assert {s.index for s in assignment.shares()} == {1}
        engine.allocate(pod.key, assignment, pod)
    assert engine.filter(whole("w", 1)).feasible == []


def test_allowed_and_denied_models() -> None:
    engine = Engine([gpu_node("t4", model="T4"), gpu_node("a100", model="A100")])
    only_a100 = share("a", 100, allowed_models=frozenset({"A100"}))
    assert engine.filter(only_a100).feasible == ["a100"]
    no_t4 = share("b", 100, denied_models=frozenset({"T4"}))
    assert engine.place(no_t4).node == "a100"
    result = engine.filter(share("c", 100, allowed_models=frozenset({"H100"})))
    assert result.feasible == []
    failure = result.failed["t4"]
    assert (failure.kind, failure.offered, failure.allowed) == (
        FitKind.MODEL_NOT_ACCEPTED, ("T4",), ("H100",))
    assert describe(failure) == "the node has T4 cards; the pod accepts H100"


def test_host_cpu_and_memory_are_checked() -> None:
    engine = Engine([gpu_node("n1", cpu=4000, mem=8192)])
    big = cpu_only("cpu", 3000, 4096)
    engine.allocate(big.key, engine.place(big), big)
    with pytest.raises(Unschedulable) as err:
        engine.place(cpu_only("more", 2000))
    assert err.value.category == "cpu"
    with pytest.raises(Unschedulable) as err2:
        engine.place(cpu_only("mem", 100, 8000))
    assert err2.value.category == "memory"


def test_host_checks_can_be_left_to_kube_scheduler() -> None:
    engine = Engine([gpu_node("n1", cpu=1000)], PolicyConfig(check_host_resources=False))
    assert engine.filter(share("a", 100, cpu=64000)).feasible == ["n1"]


def test_each_container_gets_its_own_cards_and_shares_may_meet_on_a_card() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = PodRequest("multi", containers=(
        ContainerRequest.whole("trainer", 1), ContainerRequest.share("side", 300),
        ContainerRequest.share("side2", 300), ContainerRequest("sidecar")))
    assignment = engine.place(pod)
    engine.allocate(pod.key, assignment, pod)
    trainer = {s.index for s in assignment.containers["trainer"]}
    sides = ({s.index for s in assignment.containers["side"]}
             | {s.index for s in assignment.containers["side2"]})
    assert trainer.isdisjoint(sides)
    assert len(sides) == 1  # binpack puts both shares on the one remaining card
    assert "sidecar" not in assignment.containers


def test_multi_container_pod_that_cannot_fit_is_rejected() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = PodRequest("multi", containers=(ContainerRequest.whole("a", 2), ContainerRequest.share("b", 10)))
    with pytest.raises(Unschedulable):
        engine.place(pod)


def test_mig_requests_take_free_instances_and_mig_cards_take_nothing_else() -> None:
    engine = Engine([mig_node("m")])
    first = mig("a")
    assignment = engine.place(first)
    (got,) = list(assignment.shares())
    assert got.mig_profile == "3g.40gb" and got.index == 0 and got.mig_uuid
    engine.allocate(first.key, assignment, first)
    second = mig("b")
    engine.allocate(second.key, engine.place(second), second)
    with pytest.raises(Unschedulable) as err:
        engine.place(mig("c"))
    assert err.value.category == "mig"
    # shares and whole cards only ever land on the non-MIG card 1
    for i in range(3):
        pod = share(f"s{i}", 300)
        assignment = engine.place(pod)
        assert {s.index for s in assignment.shares()} == {1}
        engine.allocate(pod.key, assignment, pod)


def test_allocating_a_held_mig_instance_fails() -> None:
    engine = Engine([mig_node("m")])
    first = mig("a")
    assignment = engine.place(first)
    engine.allocate(first.key, assignment, first)
    with pytest.raises(Unschedulable):
        engine.allocate("default/other", assignment)


def test_filter_reports_every_failed_and_unknown_node() -> None:
    engine = Engine([gpu_node("n1", cards=1), gpu_node("n2", cards=4)])
    result = engine.filter(whole("w", 2), ["n1", "n2", "ghost"])
    assert result.feasible == ["n2"]
    assert result.failed["n1"] == FitFailure(FitKind.INSUFFICIENT_CARDS, "", 2, 1, 1, Unit.CARDS,
                                             "main")
    assert describe(result.failed["n1"]) == "1 of 1 cards are entirely free, container main needs 2"
    assert result.failed["ghost"].kind is FitKind.UNKNOWN_NODE


def test_topology_card_policy_keeps_a_multi_card_request_on_one_nvlink_island() -> None:
    engine = Engine([nvlink_node()], PolicyConfig(card_policy="topology"))
    # occupy cards 0 and 5 so that the lowest free indexes would straddle the islands
    for index in (0, 5):
        engine.allocate(f"default/block{index}", Assignment("dgx", {"main": (
            CardShare(index, f"GPU-dgx-{index}", 1000, 81920),)}))
    picked = {s.index for s in engine.place(whole("w", 3)).shares()}
    assert picked in ({1, 2, 3}, {4, 6, 7})
    binpack = Engine([nvlink_node()])
    for index in (0, 5):
        binpack.allocate(f"default/block{index}", Assignment("dgx", {"main": (
            CardShare(index, f"GPU-dgx-{index}", 1000, 81920),)}))
    assert {s.index for s in binpack.place(whole("w", 3)).shares()} == {1, 2, 3}


def test_per_pod_policy_annotations_win_over_the_config() -> None:
    engine = Engine([gpu_node("a", cards=4), gpu_node("b", cards=4)], PolicyConfig(node_policy="binpack"))
    first = share("x", 500)
    engine.allocate(first.key, engine.place(first), first)
    used = engine.allocation(first.key)
    assert used is not None
    spread_pod = share("y", 100, node_policy="spread")
    assert engine.place(spread_pod).node != used.node
    assert engine.place(share("z", 100)).node == used.node


# ---------------------------------------------------------------- structured fit failures


def test_each_failed_check_has_its_own_kind_with_the_numbers() -> None:
    """Every first-failing check of `filter` reports its kind and the numbers behind it, and the
    sentence made from it never names the node (kube-scheduler counts identical reasons)."""
    nodes = [gpu_node("cpu-full", cpu=500), gpu_node("mem-full", mem=512),
             gpu_node("sick", cards=2, unhealthy=(0, 1)), gpu_node("a100", model="A100"),
             gpu_node("small", cards=1, memory=8000), mig_node("mig")]
    engine = Engine(nodes)
    failed = engine.filter(share("p", 300, memory=12000, denied_models=frozenset({"A100"}))).failed
    assert failed["cpu-full"] == FitFailure(FitKind.HOST_CPU, "cpu", 1000, 500, 500, Unit.MILLI_CPU)
    assert failed["mem-full"] == FitFailure(FitKind.HOST_MEMORY, "memory", 1024, 512, 512, Unit.MIB)
    assert failed["sick"] == FitFailure(FitKind.NO_HEALTHY_GPU, capacity=2, unit=Unit.CARDS)
    assert failed["a100"].kind is FitKind.MODEL_NOT_ACCEPTED
    assert failed["a100"].denied == ("A100",) and failed["a100"].allowed is None
    assert failed["small"] == FitFailure(FitKind.INSUFFICIENT_SHARE, "", 1, 0, 1, Unit.CARDS, "main",
                                         True, per_card_milli=300, per_card_mib=12000)
    # the MIG node has only A100 cards (one MIG-enabled): refused by model first
    assert failed["mig"].kind is FitKind.MODEL_NOT_ACCEPTED
    texts = {name: describe(f) for name, f in failed.items()}
    assert texts == {
        "cpu-full": "500 milli-CPU free, 1000 asked",
        "mem-full": "512 MiB of memory free, 1024 asked",
        "sick": "no healthy GPU (0 of 2 cards)",
        "a100": "the node has A100 cards; the pod accepts anything but A100",
        "small": "0/1 cards have 30% compute and 12000 MiB free among the accepted models "
                 "(container main)",
        "mig": "the node has A100 cards; the pod accepts anything but A100",
    }
    for name, text in texts.items():
        assert name not in text


def test_mig_shortage_names_the_profile_and_counts_instances() -> None:
    engine = Engine([mig_node("m")])
    with pytest.raises(Unschedulable) as err:
        engine.assign(mig("a", count=3), "m")
    failure = err.value.failure
    assert failure == FitFailure(FitKind.INSUFFICIENT_MIG, "nvidia.com/mig-3g.40gb", 3, 2, 2,
                                 Unit.INSTANCES, "main")
    assert err.value.category == "mig" and err.value.node == "m"
    assert err.value.reason == "node m: 2 of 2 MIG 3g.40gb instances free, container main needs 3"


def test_a_cluster_wide_failure_counts_nodes_by_category_and_shows_an_example() -> None:
    engine = Engine([gpu_node("c1", cpu=500), gpu_node("c2", cpu=500), gpu_node("g", cards=1)])
    with pytest.raises(Unschedulable) as err:
        engine.place(whole("w", 2))
    summary = err.value.summary
    assert summary is not None
    assert summary.counts == (("cpu", 2), ("gpu", 1)) and summary.category == "cpu"
    assert err.value.category == "cpu" and err.value.kind is FitKind.HOST_CPU
    assert err.value.reason == ("0/3 nodes can host pod default/w (2 cpu, 1 gpu); "
                                "e.g. node c1: 500 milli-CPU free, 1000 asked")


def test_cluster_wide_counts_classify_mig_and_unhealthy_nodes_by_their_first_check() -> None:
    # A MIG-only pod on a full MIG node is short of instances ("mig"), not of a model; a node
    # whose cards are all unhealthy has no healthy GPU ("gpu"), not a model problem.
    engine = Engine([mig_node("m"), gpu_node("sick", cards=1, unhealthy=(0,), model="A100")])
    for name in ("a", "b"):
        pod = mig(name)
        engine.allocate(pod.key, engine.place(pod), pod)
    with pytest.raises(Unschedulable) as err:
        engine.place(mig("c"))
    summary = err.value.summary
    assert summary is not None
    assert dict(summary.counts) == {"mig": 1, "gpu": 1}
    kinds = {engine.filter(mig("c")).failed[n].kind for n in ("m", "sick")}
    assert kinds == {FitKind.INSUFFICIENT_MIG, FitKind.NO_HEALTHY_GPU}


def test_ledger_refusals_are_structured_and_name_the_node_only_in_the_reason() -> None:
    engine = Engine([gpu_node("n1", cards=1, memory=8000)])
    first = share("a", 600, memory=6000)
    engine.allocate(first.key, engine.place(first), first)
    over = Assignment("n1", {"main": (CardShare(0, "GPU-n1-0", 500, 0),)})
    with pytest.raises(Unschedulable) as err:
        engine.allocate("default/b", over)
    assert err.value.failure == FitFailure(FitKind.CARD_COMPUTE, "", 500, 400, 1000,
                                           Unit.MILLI_CARDS, card=0)
    assert err.value.reason == "node n1: card 0 has 40% compute free, 50% compute asked"
    memory = Assignment("n1", {"main": (CardShare(0, "GPU-n1-0", 100, 4000),)})
    with pytest.raises(Unschedulable) as err2:
        engine.allocate("default/c", memory)
    assert (err2.value.kind, err2.value.failure.free, err2.value.failure.requested) == (
        FitKind.CARD_MEMORY, 2000, 4000)
    missing = Assignment("n1", {"main": (CardShare(7, "GPU-x", 100, 0),)})
    with pytest.raises(Unschedulable) as err3:
        engine.allocate("default/d", missing)
    assert err3.value.failure == FitFailure(FitKind.NO_SUCH_CARD, card=7)
    with pytest.raises(Unschedulable) as err4:
        engine.allocate("default/e", Assignment("ghost", {}))
    assert err4.value.kind is FitKind.UNKNOWN_NODE and err4.value.category == "node"
    assert err4.value.reason == "node ghost is unknown to the GPU scheduler"


def test_held_and_missing_mig_instances_and_mig_cards_are_distinct_kinds() -> None:
    engine = Engine([mig_node("m")])
    first = mig("a")
    taken = engine.place(first)
    engine.allocate(first.key, taken, first)
    with pytest.raises(Unschedulable) as held:
        engine.allocate("default/other", taken)
    assert held.value.kind is FitKind.MIG_INSTANCE_HELD and held.value.failure.holder == first.key
    ghost = Assignment("m", {"main": (CardShare(0, "GPU-m-0", 0, 40960, "3g.40gb", "MIG-nope"),)})
    with pytest.raises(Unschedulable) as missing:
        engine.allocate("default/x", ghost)
    assert missing.value.kind is FitKind.NO_SUCH_MIG_INSTANCE
    plain = Assignment("m", {"main": (CardShare(0, "GPU-m-0", 100, 0),)})
    with pytest.raises(Unschedulable) as mig_card:
        engine.allocate("default/y", plain)
    assert mig_card.value.kind is FitKind.MIG_ENABLED_CARD
    assert {held.value.category, missing.value.category, mig_card.value.category} == {"mig"}


def test_unschedulable_keeps_its_structure_across_processes() -> None:
    engine = Engine([gpu_node("c1", cpu=500)])
    with pytest.raises(Unschedulable) as err:
        engine.place(whole("w", 1))
    copy = pickle.loads(pickle.dumps(err.value))
    assert (copy.failure, copy.node, copy.summary, copy.reason) == (
        err.value.failure, err.value.node, err.value.summary, err.value.reason)


def test_every_kind_is_described_without_a_node_name_and_counted_in_a_category() -> None:
    for kind in FitKind:
        failure = FitFailure(kind, "nvidia.com/mig-1g.10gb", 2, 1, 4, Unit.CARDS, "main",
                             offered=("T4",), allowed=("A100",), card=0, instance="MIG-x",
                             holder="ns/p", claim_blocks=(ClaimBlock(BlockKind.MISSING, "ns/c"),),
                             claim="ns/c", elastic_gpu="egpu-1", node="bound-node",
                             asked=("elasticgpu.io/gpu-core",), device_class="gpu.elasticgpu.io")
        text = describe(failure)
        assert text and "None" not in text
        # only a claim bound elsewhere names a node: its ElasticGPU's, the same for every node
        # it refuses (the DRA refusals name none, so kube-scheduler counts them as one reason)
        assert ("bound-node" in text) is (kind is FitKind.CLAIM_ON_OTHER_NODE)
        assert kind.category in {"cpu", "memory", "model", "resource", "mig", "node", "gpu",
                                 "claim", "dra"}


# ---------------------------------------------------------------- the card tier pairing


def test_without_a_card_policy_the_node_policys_pairing_chooses_cards() -> None:
    engine = Engine([gpu_node("n")], PolicyConfig(node_policy="fgdx-mem"))
    assert engine.card_policy_for(share("a", 100)) == "fgd-waste"
    assert engine.card_policy_for(share("b", 100, node_policy="random")) == "random"
    assert engine.card_policy_for(share("c", 100, card_policy="spread")) == "spread"
    explicit = Engine([gpu_node("n")], PolicyConfig(node_policy="fgdx-mem", card_policy="binpack"))
    assert explicit.card_policy_for(share("d", 100)) == "binpack"
    assert explicit.card_policy_for(share("e", 100, card_policy="topology")) == "topology"


def _two_instance_node(name: str, split: bool) -> Node:
    """Two free 1g.10gb instances: both on card 0 (`split` False) or one on each card."""
    p = MigProfile.parse("1g.10gb")
    first = (MigInstance(p, f"MIG-{name}-a", 0),) + (() if split else (MigInstance(p, f"MIG-{name}-b", 1),))
    second = (MigInstance(p, f"MIG-{name}-b", 0),) if split else ()
    return Node(name, 64000, 1 << 19, (Card(0, f"GPU-{name}-0", "A100", 81920, mig=first),
                                      Card(1, f"GPU-{name}-1", "A100", 81920, mig=second)))


def _two_instances(distinct: bool) -> PodRequest:
    return PodRequest("h", containers=(ContainerRequest(
        "main", RequestKind.MIG, 2, 0, 0, MigProfile.parse("1g.10gb"), distinct=distinct),))


def test_mig_instances_on_distinct_cards_take_one_per_card_or_say_why() -> None:
    """HAMi's `nvidia.com/gpu: 2` under vgpu-mode mig: one instance on each of two cards;
    our own `nvidia.com/mig-1g.10gb: 2` may take both of one card."""
    engine = Engine([_two_instance_node("one", split=False), _two_instance_node("two", split=True)])
    assert engine.filter(_two_instances(False)).failed == {}
    failed = engine.filter(_two_instances(True)).failed
    assert failed == {"one": FitFailure(FitKind.MIG_DISTINCT_CARDS, "nvidia.com/mig-1g.10gb",
                                        2, 1, 1, Unit.CARDS, "main")}
    assert describe(failed["one"]) == ("1 of 1 cards with MIG 1g.10gb instances have one free, "
                                       "container main needs one on each of 2 distinct cards")
    placed = engine.assign(_two_instances(True), "two")
    assert {s.uuid for s in placed.containers["main"]} == {"GPU-two-0", "GPU-two-1"}
    with pytest.raises(Unschedulable) as err:
        engine.assign(_two_instances(True), "one")
    assert err.value.kind is FitKind.MIG_DISTINCT_CARDS and err.value.category == "mig"
