"""The allocation ledger: capacity checks, idempotence, release, inventory changes."""

from __future__ import annotations

import pytest
from engine_helpers import gpu_node, share, whole

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable


def one_share(node: str, index: int, milli: int, memory: int = 0) -> Assignment:
    return Assignment(node, {"main": (CardShare(index, f"GPU-{node}-{index}", milli, memory),)})


def test_allocate_rejects_overcommit_of_compute_and_memory() -> None:
    engine = Engine([gpu_node("n1", cards=1, memory=1000)])
    engine.allocate("ns/a", one_share("n1", 0, 700, 600))
    with pytest.raises(Unschedulable, match="% compute free"):
        engine.allocate("ns/b", one_share("n1", 0, 400))
    with pytest.raises(Unschedulable, match="MiB free"):
        engine.allocate("ns/c", one_share("n1", 0, 100, 500))
    assert engine.card_usage("n1") == [(0, 700, 600)]


def test_allocate_rejects_host_overcommit_and_unknown_cards() -> None:
    engine = Engine([gpu_node("n1", cards=1, cpu=2000)])
    pod = share("a", 100, cpu=1500)
    engine.allocate(pod.key, one_share("n1", 0, 100), pod)
    second = share("b", 100, cpu=1000)
    with pytest.raises(Unschedulable) as err:
        engine.allocate(second.key, one_share("n1", 0, 100), second)
    assert err.value.category == "cpu"
    with pytest.raises(Unschedulable, match="no card 7"):
        engine.allocate("ns/x", one_share("n1", 7, 100))
    with pytest.raises(Unschedulable, match="unknown"):
        engine.allocate("ns/y", one_share("ghost", 0, 100))


def test_allocate_is_idempotent_and_replaces_a_different_assignment() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    engine.allocate("ns/a", one_share("n1", 0, 600))
    engine.allocate("ns/a", one_share("n1", 0, 600))
    assert engine.card_usage("n1")[0] == (0, 600, 0)
    engine.allocate("ns/a", one_share("n1", 1, 300))
    assert engine.card_usage("n1") == [(0, 0, 0), (1, 300, 0)]


def test_failed_replacement_keeps_the_old_assignment() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    engine.allocate("ns/a", one_share("n1", 0, 600))
    engine.allocate("ns/b", one_share("n1", 1, 900))
    with pytest.raises(Unschedulable):
        engine.allocate("ns/a", one_share("n1", 1, 600))
    assert engine.allocation("ns/a") == one_share("n1", 0, 600)
    assert engine.card_usage("n1") == [(0, 600, 0), (1, 900, 0)]


def test_release_frees_and_returns_the_assignment() -> None:
    engine = Engine([gpu_node("n1", cards=1)])
    pod = whole("w", 1)
    assignment = engine.place(pod)
    engine.allocate(pod.key, assignment, pod)
    assert engine.filter(whole("w2", 1)).feasible == []
    assert engine.release(pod.key) == assignment
    assert engine.release(pod.key) is None
    assert engine.filter(whole("w2", 1)).feasible == ["n1"]
    assert engine.host_usage("n1") == (0, 0)


def test_upsert_keeps_allocations_on_cards_that_still_exist() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    engine.allocate("ns/a", one_share("n1", 0, 500))
    engine.allocate("ns/b", one_share("n1", 1, 400))
    shrunk = Node("n1", 32000, 65536, (Card(0, "GPU-n1-0", "T4", 16000),))
    engine.upsert_node(shrunk)
    assert engine.card_usage("n1") == [(0, 500, 0)]
    assert engine.filter(share("c", 600)).feasible == []
    assert engine.filter(share("d", 500)).feasible == ["n1"]


def test_health_updates_take_effect_and_removed_nodes_are_forgotten() -> None:
    engine = Engine([gpu_node("n1", cards=1), gpu_node("n2", cards=1)])
    engine.upsert_node(gpu_node("n1", cards=1, unhealthy=(0,)))
    assert engine.filter(share("a", 100)).feasible == ["n2"]
    engine.remove_node("n2")
    assert engine.nodes() == ["n1"]
    with pytest.raises(Unschedulable):
        engine.place(share("b", 100))


def test_score_leaves_out_nodes_that_cannot_host() -> None:
    engine = Engine([gpu_node("small", cards=1), gpu_node("big", cards=4)])
    scores = engine.score(whole("w", 2), ["small", "big", "ghost"])
    assert list(scores) == ["big"]


def test_unknown_policy_names_fail_clearly() -> None:
    with pytest.raises(ValueError, match="unknown node policy"):
        Engine([], config=__import__("elastic_gpu.core.placement", fromlist=["PolicyConfig"]).PolicyConfig(
            node_policy="nope"))


def test_outside_usage_counts_in_views_and_host_fit_and_waits_for_its_node() -> None:
    from engine_helpers import cpu_only

    engine = Engine([gpu_node("a", cpu=8000, mem=16384)])
    engine.set_outside_usage("b", 1000, 1024)  # not known yet: applied when it appears
    engine.set_outside_usage("a", 6000, 4096)
    view = engine.node_view("a")
    assert (view.cpu_free, view.memory_free) == (2000, 12288)
    with pytest.raises(Unschedulable, match="milli-CPU"):
        engine.place(cpu_only("big", 3000))
    assert engine.place(cpu_only("small", 2000)).node == "a"
    engine.upsert_node(gpu_node("b", cpu=8000, mem=16384))
    assert engine.host_usage("b") == (1000, 1024)
    engine.set_outside_usage("a", 0, 0)
    assert engine.node_view("a").cpu_free == 8000
    # the extender's engine (no host checks) still shows it to policies, but never refuses
    blind = Engine([gpu_node("a", cpu=8000)], PolicyConfig(check_host_resources=False))
    blind.set_outside_usage("a", 8000, 0)
    assert blind.node_view("a").cpu_free == 0
    assert blind.place(cpu_only("c", 4000)).node == "a"
