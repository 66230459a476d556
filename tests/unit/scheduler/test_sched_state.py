"""The extender's state: reservations, annotations as the source of truth, expiry, what-ifs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from egpu_testing.workbench import feed_nodes, pod_manifest, ready_state
from elastic_gpu.api.gpudevice import object_name
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.fit import FitKind
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.placement.engine import ScoredNodes
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.handle import BindError
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState, StateNotReady
from elastic_gpu.scheduler.state.placement import rescale_scored
from elastic_gpu.scheduler.verbs import parse_pod


def gpu_node(name: str, cards: int = 1, memory: int = 16384) -> Node:
    return Node(name, 64_000, 256_000, tuple(Card(i, f"GPU-{name}-{i}", "T4", memory)
                                             for i in range(cards)))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def share_pod(name: str, percent: int, memory: int = 0, **kw: Any) -> dict[str, Any]:
    limits = {"elasticgpu.io/gpu-core": str(percent)}
    if memory:
        limits["elasticgpu.io/gpu-memory"] = str(memory)
    return pod_manifest(name, uid=f"uid-{name}", limits=limits, **kw)


def annotated(pod: dict[str, Any], assignment: Assignment, rv: int = 10,
              node_name: str = "") -> dict[str, Any]:
    """`pod` with the annotations the scheduler's Binding writes (assignment, assigned node)."""
    pod = json.loads(json.dumps(pod))
    notes = pod["metadata"].setdefault("annotations", {})
    notes[ann.ASSIGNMENT] = assignment.to_json()
    notes[ann.ASSIGNED_NODE] = assignment.node
    pod["metadata"]["resourceVersion"] = str(rv)
    if node_name:
        pod["spec"]["nodeName"] = node_name
    return pod


def used(state: SchedulerState, node: str) -> int:
    return sum(milli for _, milli, _ in state.card_usage()[node])


def bind(state: SchedulerState, pod: dict[str, Any], node: str) -> Assignment:
    """What a successful bind does to the state: reserve, then settle as bound."""
    uid = pod["metadata"]["uid"]
    token, assignment = state.reserve(pod_request_from_manifest(pod), uid, node)
    state.settle(uid, token, "bound", with_binding(pod, node, assignment))
    return assignment


def test_not_ready_until_every_cache_synced() -> None:
    state = SchedulerState()
    req = pod_request_from_manifest(share_pod("a", 10))
    with pytest.raises(StateNotReady, match="elasticgpuclaims, elasticgpuclasses, elasticgpus, "
                                            "gpudevices, nodes, pods"):
        state.filter(req, "uid-a", ["n"])
    for source in ("nodes", "pods", "elasticgpus", "elasticgpuclaims", "elasticgpuclasses"):
        state.mark_synced(source)
    assert not state.ready
    state.mark_synced("gpudevices")
    assert state.ready


def test_reservation_is_seen_by_the_next_filter() -> None:
    state = ready_state([gpu_node("n1")])
    a, b = share_pod("a", 60), share_pod("b", 60)
    state.reserve(pod_request_from_manifest(a), "uid-a", "n1")
    result = state.filter(pod_request_from_manifest(b), "uid-b", ["n1"])
    assert result.feasible == []
    failure = result.failed["n1"]
    assert (failure.kind, failure.per_card_milli, failure.free, failure.capacity) == (
        FitKind.INSUFFICIENT_SHARE, 600, 0, 1)
    with pytest.raises(Unschedulable):
        state.reserve(pod_request_from_manifest(b), "uid-b", "n1")
    assert used(state, "n1") == 600


def test_restart_rebuilds_holds_from_annotations() -> None:
    first = ready_state([gpu_node("n1", 2)])
    pods = []
    for name, pct in (("a", 30), ("b", 50), ("c", 70)):
        pod = share_pod(name, pct)
        assignment = bind(first, pod, "n1")
        pods.append(annotated(pod, assignment, node_name="n1"))
    second = ready_state([gpu_node("n1", 2)], pods=pods)
    assert second.holds() == first.holds()
    assert second.card_usage() == first.card_usage()
    assert used(second, "n1") == 1500
    assert first.inflight() == {} == second.inflight()


def test_unknown_outcome_holds_until_ttl_unless_the_pod_shows_up_bound() -> None:
    clock = Clock()
    state = ready_state([gpu_node("n1")],
                        SchedulerState(SchedulerConfig(reservation_ttl_s=5), clock=clock))
    lost, landed = share_pod("lost", 40), share_pod("landed", 40)
    state.observe_pod(lost)
    state.observe_pod(landed)
    lost_token, _ = state.reserve(pod_request_from_manifest(lost), "uid-lost", "n1")
    landed_token, assignment = state.reserve(pod_request_from_manifest(landed), "uid-landed",
                                             "n1")
    # A bind still running never expires, however long it takes.
    clock.now += 100
    assert state.expire() == 0
    # Both Bindings timed out; `landed`'s did land: the watch shows it bound.
    state.settle("uid-lost", lost_token, "unknown")
    state.settle("uid-landed", landed_token, "unknown")
    state.observe_pod(annotated(landed, assignment, rv=20, node_name="n1"))
    assert used(state, "n1") == 800
    clock.now += 4
    assert state.expire() == 0
    clock.now += 2
    assert state.expire() == 1
    assert set(state.holds()) == {"uid-landed"} and state.inflight() == {}
    assert used(state, "n1") == 400


def test_reservations_kept_for_the_ttl_each_expire_at_their_own_deadline() -> None:
    """`expire` scans only once the earliest deadline has passed; after a scan the next
    deadline is the earliest of those left, so a later reservation still expires on time."""
    clock = Clock()
    state = ready_state([gpu_node("n1")],
                        SchedulerState(SchedulerConfig(reservation_ttl_s=5), clock=clock))
    early, late = share_pod("early", 30), share_pod("late", 30)
    tokens = {}
    for pod in (early, late):
        state.observe_pod(pod)
        tokens[pod["metadata"]["name"]], _ = state.reserve(
            pod_request_from_manifest(pod), pod["metadata"]["uid"], "n1")
    state.settle(early["metadata"]["uid"], tokens["early"], "unknown")  # deadline 5
    clock.now += 3
    state.settle(late["metadata"]["uid"], tokens["late"], "unknown")  # deadline 8
    assert state.expire() == 0 and used(state, "n1") == 600
    clock.now += 3  # 6
    assert state.expire() == 1 and used(state, "n1") == 300
    clock.now += 1  # 7
    assert state.expire() == 0
    clock.now += 1  # 8
    assert state.expire() == 1 and used(state, "n1") == 0 and state.inflight() == {}


def test_a_retry_while_the_first_outcome_is_unknown_counts_both() -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    pod = share_pod("a", 60)
    state.observe_pod(pod)
    request = pod_request_from_manifest(pod)
    first, on_n1 = state.reserve(request, "uid-a", "n1")
    state.settle("uid-a", first, "unknown")
    second, _ = state.reserve(request, "uid-a", "n2")
    assert used(state, "n1") == 600 and used(state, "n2") == 600
    state.settle("uid-a", second, "failed")
    # The first attempt landed after all: the pod shows up bound to n1.
    state.observe_pod(annotated(pod, on_n1, rv=9, node_name="n1"))
    assert used(state, "n1") == 600 and used(state, "n2") == 0
    assert state.inflight() == {}


def test_stale_watch_event_does_not_undo_a_bind() -> None:
    state = ready_state([gpu_node("n1")])
    pod = share_pod("a", 50)
    pod["metadata"]["resourceVersion"] = "5"
    state.observe_pod(pod)
    assignment = bind(state, pod, "n1")
    state.observe_pod(pod)  # the watch delivers rv 5 (unbound, no annotation) late
    assert state.holds() == {"uid-a": assignment}
    state.observe_pod(annotated(pod, assignment, rv=6, node_name="n1"))  # the real event
    assert state.holds() == {"uid-a": assignment}


def test_an_unbound_copy_newer_than_the_one_the_bind_read_does_not_undo_the_bind() -> None:
    """The bind completed the copy it read (rv 5); before its Binding landed, kube-scheduler
    wrote the pod's status (PodScheduled false, from an earlier failed attempt: rv 6). The
    watch then delivers rv 6, unbound and newer than what the state holds: the pod must keep
    its card, or the next pod is given it while the Binding's own event (rv 7) is on the way
    (seen in bench/dra_packing.py: two whole-card pods on one card)."""
    state = ready_state([gpu_node("n1")])
    pod = pod_manifest("a", uid="uid-a", limits={"nvidia.com/gpu": "1"})
    pod["metadata"]["resourceVersion"] = "5"
    state.observe_pod(pod)
    assignment = bind(state, pod, "n1")
    later = json.loads(json.dumps(pod))
    later["metadata"]["resourceVersion"] = "6"
    later["status"] = {"conditions": [{"type": "PodScheduled", "status": "False",
                                       "reason": "Unschedulable"}]}
    state.observe_pod(later)
    assert state.holds() == {"uid-a": assignment}
    other = pod_manifest("b", uid="uid-b", limits={"nvidia.com/gpu": "1"})
    with pytest.raises(Unschedulable):
        state.reserve(pod_request_from_manifest(other), "uid-b", "n1")
    state.observe_pod(annotated(pod, assignment, rv=7, node_name="n1"))  # the Binding's event
    assert state.holds() == {"uid-a": assignment}


def test_terminated_deleted_and_rebound_pods_release() -> None:
    state = ready_state([gpu_node("n1", 3), gpu_node("n2", 1)])
    holders = {}
    for name in ("done", "gone", "moved"):
        pod = share_pod(name, 90)
        holders[name] = annotated(pod, bind(state, pod, "n1"), rv=10, node_name="n1")
    assert used(state, "n1") == 2700
    done = json.loads(json.dumps(holders["done"]))
    done["status"] = {"phase": "Succeeded"}
    done["metadata"]["resourceVersion"] = "11"
    state.observe_pod(done)
    state.forget_pod("uid-gone")
    moved = json.loads(json.dumps(holders["moved"]))
    moved["spec"]["nodeName"] = "n2"  # bound elsewhere: its annotation is stale
    moved["metadata"]["resourceVersion"] = "11"
    state.observe_pod(moved)
    assert state.holds() == {}
    assert used(state, "n1") == 0


def test_an_annotated_pod_that_is_not_bound_holds_nothing() -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    pod = share_pod("a", 80)
    other = pod_request_from_manifest(share_pod("b", 80))
    # An annotated pod that is not bound: no Binding of the scheduler wrote it (issue #26: a
    # hand-written assignment on a pod that never schedules held a node's cards).
    token, assignment = state.reserve(pod_request_from_manifest(pod), "uid-a", "n1")
    state.settle("uid-a", token, "failed")
    state.observe_pod(annotated(pod, assignment))
    assert used(state, "n1") == 0 and "uid-a" in state.distrusted()
    assert state.filter(other, "uid-b", ["n1"]).feasible == ["n1"]
    # Bound, with the assignment its Binding wrote: counted where it is bound, and only there.
    bind(state, annotated(pod, assignment), "n2")
    assert used(state, "n1") == 0 and used(state, "n2") == 800
    assert state.distrusted() == {}


def test_failed_reserve_keeps_what_was_held() -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    pod = share_pod("a", 70)
    state.observe_pod(pod)
    first, held = state.reserve(pod_request_from_manifest(pod), "uid-a", "n1")
    state.reserve(pod_request_from_manifest(share_pod("b", 50)), "uid-b", "n2")
    with pytest.raises(Unschedulable):
        state.reserve(pod_request_from_manifest(pod), "uid-a", "n2")
    assert state.inflight()["uid-a"] == [held]
    state.settle("uid-a", first, "failed")
    assert "uid-a" not in state.inflight()
    assert used(state, "n1") == 0


def test_node_removed_and_back_keeps_counting_its_pods() -> None:
    state = ready_state([gpu_node("n1")])
    bind(state, share_pod("a", 60), "n1")
    state.remove_node("n1")
    assert "n1" not in state.node_names()
    feed_nodes(state, [gpu_node("n1")])
    assert used(state, "n1") == 600


def test_a_card_gone_and_back_counts_its_pods_share_again() -> None:
    """The engine drops a share from its ledger entry when the card leaves the node (a replay
    keeps only cards that exist); the state's ledger counts the pod again when the card comes
    back (the agent re-published it: a restart, a card that was unhealthy), so the card is not
    given twice."""
    state = ready_state([gpu_node("n1", cards=2)])
    held = bind(state, share_pod("a", 60), "n1")
    (card,) = {share.index for share in held.shares()}
    other = 1 - card
    feed_nodes(state, [Node("n1", 64_000, 256_000, (Card(other, f"GPU-n1-{other}", "T4",
                                                         16384),))])
    assert used(state, "n1") == 0  # the card is gone: nothing counted on the card left
    feed_nodes(state, [gpu_node("n1", cards=2)])
    assert dict((index, milli) for index, milli, _ in state.card_usage()["n1"])[card] == 600
    # 60 % is held there again: a 50 % share goes to the other card
    assert {s.index for s in bind(state, share_pod("b", 50), "n1").shares()} == {other}


def test_preempt_adds_gpu_victims_until_the_pod_fits() -> None:
    state = ready_state([gpu_node("n1", 1), gpu_node("n2", 1)])
    for name, node, pct, prio in (("lo1", "n1", 40, 0), ("lo2", "n1", 40, 1),
                                  ("hi", "n2", 90, 100)):
        bind(state, share_pod(name, pct, priority=prio), node)
    preemptor = share_pod("p", 50, priority=50)
    state.observe_pod(preemptor)
    request = pod_request_from_manifest(preemptor)
    chosen = state.preempt(request, "uid-p", {"n1": ([], 0), "n2": ([], 0)})
    # n1: evicting the lowest-priority 40% frees enough; n2's pod outranks the preemptor.
    assert chosen == {"n1": (["uid-lo1"], 0)}
    # The what-if left every hold in place.
    assert used(state, "n1") == 800 and used(state, "n2") == 900


def test_preempt_gives_back_added_victims_the_fit_does_not_need() -> None:
    """card 0: a (priority 0, 20%) beside an outranking 70%; card 1: b (priority 1, 60%). A 50%
    preemptor: the lowest-priority pod a is tried first but frees too little on its card; b
    frees card 1, and then a is not needed: only b goes (it used to be both)."""
    state = ready_state([gpu_node("n1", 2)])
    for name, pct, prio in (("hi", 70, 100), ("a", 20, 0), ("b", 60, 1)):
        bind(state, share_pod(name, pct, priority=prio), "n1")
    holds = {uid.removeprefix("uid-"): [s.index for s in a.shares()]
             for uid, a in state.holds().items()}
    assert holds["hi"] == holds["a"] != holds["b"], holds  # the layout the case needs
    preemptor = share_pod("p", 50, priority=50)
    state.observe_pod(preemptor)
    request = pod_request_from_manifest(preemptor)
    assert state.preempt(request, "uid-p", {"n1": ([], 0)}) == {"n1": (["uid-b"], 0)}
    # kube-scheduler's own victims are kept, even one the cards do not need
    assert state.preempt(request, "uid-p", {"n1": (["uid-a"], 0)}) == {
        "n1": (["uid-a", "uid-b"], 0)}
    assert used(state, "n1") == 1500  # the what-if left every hold in place


def test_many_failed_nodes_are_explained_up_to_the_limit() -> None:
    from elastic_gpu.scheduler.state.placement import DETAIL_LIMIT, SUMMARY_FAILURE

    nodes = [gpu_node(f"n{i:03d}") for i in range(DETAIL_LIMIT + 49)]
    state = ready_state(nodes)
    for node in nodes[:-1]:  # all but the last node full
        bind(state, share_pod(f"fill-{node.name}", 90), node.name)
    names = [n.name for n in nodes] + ["ghost"]
    result = state.filter(pod_request_from_manifest(share_pod("x", 50)), "uid-x", names)
    assert result.feasible == [nodes[-1].name]
    assert set(result.failed) == set(names) - {nodes[-1].name}
    detailed = [f for f in result.failed.values()
                if f.kind is FitKind.INSUFFICIENT_SHARE and f.per_card_milli == 500]
    assert len(detailed) == DETAIL_LIMIT
    assert list(result.failed.values()).count(SUMMARY_FAILURE) == 48
    assert result.failed["ghost"].kind is FitKind.UNKNOWN_NODE


def test_rescale_to_kube_scheduler_range() -> None:
    def scored(scores: dict[str, float]) -> ScoredNodes:
        return ScoredNodes(list(scores), np.array(list(scores.values()), dtype=np.float64), [])

    assert rescale_scored(scored({"a": 2.0, "b": 4.0, "c": 3.0}), ["a", "b", "c", "d"]) == {
        "a": 0, "b": 10, "c": 5, "d": 0}
    assert rescale_scored(scored({"a": 1.0}), ["a"]) == {"a": 10}
    assert rescale_scored(scored({}), ["a"]) == {"a": 0}



def test_prioritize_reuses_filter_scores_only_while_nothing_changed() -> None:
    nodes = [gpu_node(f"n{i:02d}", 2) for i in range(20)]  # more than DETAIL_LIMIT
    state = ready_state(nodes)
    names = [n.name for n in nodes]
    request = pod_request_from_manifest(share_pod("p", 20, node_policy="binpack"))
    assert state.filter(request, "uid-p", names).feasible == names
    flat = state.prioritize(request, "uid-p", names)
    assert set(flat.values()) == {10}  # all empty: all equal
    # Another pod lands on n07: binpack must now prefer n07, not reuse the old scores.
    bind(state, share_pod("q", 50), "n07")
    ranked = state.prioritize(request, "uid-p", names)
    assert ranked["n07"] == 10 and ranked["n00"] == 0


def host_pod(name: str, node: str, cpu: str, memory: str, phase: str = "Running") -> dict[str, Any]:
    """A pod without GPUs, bound to `node`, as the pod watch delivers it."""
    pod = pod_manifest(name, uid=f"uid-{name}", containers={"main": {"cpu": cpu, "memory": memory}})
    pod["metadata"]["resourceVersion"] = "5"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    return pod


def test_bound_pods_cpu_and_memory_reach_the_policies_view_of_a_node() -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    state.observe_pod(host_pod("web", "n1", "6", "10Gi"))
    state.observe_pod(host_pod("db", "n1", "500m", "1Gi"))
    assert state.engine.host_usage("n1") == (6500, 11264)
    assert state.engine.node_view("n1").cpu_free == 64_000 - 6500
    assert state.engine.host_usage("n2") == (0, 0)
    # a finished pod holds nothing; a deleted one neither
    state.observe_pod({**host_pod("web", "n1", "6", "10Gi", phase="Succeeded"),
                       "metadata": {"name": "web", "namespace": "default", "uid": "uid-web",
                                    "resourceVersion": "6"}})
    assert state.engine.host_usage("n1") == (500, 1024)
    state.forget_pod("uid-db")
    assert state.engine.host_usage("n1") == (0, 0)


def test_host_usage_survives_an_engine_rebuild_and_waits_for_unknown_nodes() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(80)]
    state = ready_state(nodes[:1])
    state.observe_pod(host_pod("early", "n5", "2", "1Gi"))  # its node is not listed yet
    state.observe_pod(host_pod("web", "n0", "4", "2Gi"))
    feed_nodes(state, nodes)  # 79 new nodes: the state builds a fresh engine
    state.filter(pod_request_from_manifest(share_pod("probe", 10)), "uid-probe", ["n0"])
    assert state.engine.host_usage("n0") == (4000, 2048)
    assert state.engine.host_usage("n5") == (2000, 1024)


def test_fgd_in_the_extender_sees_the_cpu_other_pods_hold() -> None:
    """n1's CPU is nearly all taken by a pod without GPUs, so no typical GPU task can use its
    idle card any more: FGD puts a small share there rather than break n2's whole card.
    Without the bound pod's CPU in view the two nodes look the same."""
    def scores(with_hog: bool) -> dict[str, int]:
        state = ready_state([gpu_node("n1"), gpu_node("n2")],
                            SchedulerState(SchedulerConfig(node_policy="fgd")))
        if with_hog:
            state.observe_pod(host_pod("hog", "n1", "63", "8Gi"))
        return state.prioritize(pod_request_from_manifest(share_pod("a", 10)), "uid-a",
                                ["n1", "n2"])

    assert scores(with_hog=False)["n1"] == scores(with_hog=False)["n2"]
    hogged = scores(with_hog=True)
    assert hogged["n1"] > hogged["n2"]


def test_metrics_show_what_the_policies_see_of_bound_pods() -> None:
    from prometheus_client import generate_latest

    from elastic_gpu.scheduler.metrics import Metrics

    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    state.observe_pod(host_pod("web", "n1", "1500m", "3Gi"))
    text = asyncio.run(Metrics(state.card_usage, state.host_usage).page())[0].decode()
    assert 'elasticgpu_scheduler_node_requested_cpu_cores{node="n1"} 1.5' in text
    assert 'elasticgpu_scheduler_node_requested_memory_bytes{node="n1"} 3.221225472e+09' in text
    assert 'elasticgpu_scheduler_node_requested_cpu_cores{node="n2"} 0.0' in text
    # targetWorkload builtin: no live pods counted, the built-in mix's 11 shapes in use
    text = generate_latest(Metrics(state.card_usage, state.host_usage,
                                   state.workload_size).registry).decode()
    assert "elasticgpu_scheduler_workload_live_pods 0.0" in text
    assert "elasticgpu_scheduler_workload_typical_shapes 11.0" in text


def test_observed_workload_follows_the_live_pods() -> None:
    config = SchedulerConfig(node_policy="fgd", target_workload="observed", workload_refresh_pods=3)
    pods = [share_pod(f"s{i}", 60) for i in range(4)] + [host_pod("web", "n1", "2", "1Gi")]
    state = ready_state([gpu_node("n1"), gpu_node("n2")], SchedulerState(config), pods=pods)
    probe = pod_request_from_manifest(share_pod("probe", 10))
    state.filter(probe, "uid-probe", ["n1", "n2"])
    assert state.workload is not None
    shapes = dict(zip(state.workload.shapes, state.workload.weights, strict=True))
    assert {(s.gpu_milli, s.gpu_count) for s in shapes} == {(600, 1), (0, 0)}
    assert state.engine.ctx.frag.workload is state.workload
    # two pods leave: fewer than workloadRefreshPods changes, the workload stays
    state.forget_pod("uid-s0")
    state.forget_pod("uid-s1")
    state.filter(probe, "uid-probe", ["n1", "n2"])
    assert state.workload.shapes == tuple(shapes)
    state.forget_pod("uid-web")  # the third change: rebuilt, only the shares are left
    state.filter(probe, "uid-probe", ["n1", "n2"])
    assert [(s.gpu_milli, s.gpu_count) for s in state.workload.shapes] == [(600, 1)]


def test_the_observed_workload_takes_the_node_policys_typical_pods() -> None:
    """fgd keeps FGD's most popular 95% of the live pods' shapes; fgdx-mem keeps every shape,
    here the one whole-card pod among 39 shares."""

    def gpu_shapes(policy: str) -> set[tuple[int, int]]:
        config = SchedulerConfig(node_policy=policy, target_workload="observed")
        pods = [share_pod(f"s{i}", 60) for i in range(39)] + [share_pod("whole", 100)]
        state = ready_state([gpu_node("n1"), gpu_node("n2")], SchedulerState(config), pods=pods)
        state.filter(pod_request_from_manifest(share_pod("probe", 10)), "uid-probe", ["n1", "n2"])
        assert state.workload is not None
        return {(s.gpu_milli, s.gpu_count) for s in state.workload.shapes}

    assert gpu_shapes("fgd") == {(600, 1)}
    assert gpu_shapes("fgdx-mem") == {(600, 1), (1000, 1)}


def test_the_observed_workload_changes_where_fgd_puts_a_share() -> None:
    """One card per node; n1's has a 40% share (600 free), n2's is idle. With the built-in
    workload (whole cards are common) FGD fills n1's hole rather than break a whole card; when
    the live pods are mostly 60% shares, the 600 hole is exactly what they need, so FGD keeps
    it and breaks n2's card instead."""

    def best(target: str) -> str:
        config = SchedulerConfig(node_policy="fgd", target_workload=target,  # type: ignore[arg-type]
                                 filter_result="best")
        state = ready_state([gpu_node("n1"), gpu_node("n2")], SchedulerState(config))
        x = share_pod("x", 40)
        bind(state, x, "n1")
        for i in range(30):
            state.observe_pod(share_pod(f"wants-60-{i}", 60))
        result = state.filter(pod_request_from_manifest(share_pod("a", 30)), "uid-a",
                              ["n1", "n2"])
        (node,) = result.feasible  # filterResult best: the engine's choice only
        return node

    assert best("builtin") == "n1"
    assert best("observed") == "n2"


def test_a_pod_we_bound_counts_its_cpu_before_the_watch_reports_it() -> None:
    state = ready_state([gpu_node("n1")])
    pod = pod_manifest("p", uid="uid-p", containers={
        "main": {"elasticgpu.io/gpu-core": "20", "cpu": "3", "memory": "2Gi"}})
    bind(state, pod, "n1")
    assert state.engine.host_usage("n1") == (3000, 2048)
    # the watch's copy of the same bound pod changes nothing; its deletion releases it
    state.forget_pod("uid-p")
    assert state.engine.host_usage("n1") == (0, 0)


class GatedApi:
    """The API worker as the bind path sees it: a Binding of a pod whose gate is closed stays
    in flight until the test opens it; `refuse` makes the API say no."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.refuse: set[str] = set()
        self.bound: dict[str, str] = {}

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        gate = self.gates.get(name)
        if gate is not None:
            await gate.wait()
        if name in self.refuse:
            raise BindError(f"pods {name!r} is forbidden", definite=True, code=403)
        self.bound[name] = node


class Http:
    """kube-scheduler's side of the extender: JSON over HTTP, filter -> prioritize -> bind."""

    def __init__(self, client: TestClient[Any, Any]) -> None:
        self.client = client

    async def post(self, verb: str, body: Any) -> Any:
        response = await self.client.post(f"/{verb}", data=json.dumps(body))
        assert response.status == 200, await response.text()
        return await response.json()

    async def schedule(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, int]:
        """filter then prioritize, as one scheduling cycle: the scores of the feasible nodes."""
        args = {"Pod": pod, "NodeNames": nodes}
        feasible = (await self.post("filter", args))["NodeNames"]
        scores = await self.post("prioritize", {"Pod": pod, "NodeNames": feasible})
        # a node prioritize leaves out scores 0 (kube-scheduler adds nothing for it)
        return {**dict.fromkeys(feasible, 0), **{s["Host"]: s["Score"] for s in scores}}

    async def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        answer = await self.post("bind", {"PodName": meta["name"], "PodNamespace": "default",
                                          "PodUID": meta["uid"], "Node": node})
        return str(answer["Error"])


def http_pod(name: str, **resources: str) -> dict[str, Any]:
    """A pending pod as kube-scheduler sends it: with a UID and a resourceVersion."""
    pod = pod_manifest(name, uid=f"uid-{name}", containers={"main": dict(resources)})
    pod["metadata"]["resourceVersion"] = "3"
    return pod


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def test_a_bind_in_flight_holds_its_cpu_and_memory_on_the_http_path() -> None:
    """Through the verbs kube-scheduler calls: while the hog's Binding is in flight its 63 CPUs
    and 200 GiB count on n1, so FGD sees that no typical GPU task can use n1's idle card and
    puts the next small share there. Without the hold (the HTTP path zeroed the request's CPU
    before `reserve` saw it) n1 and n2 look the same. A refused bind gives the hold back; a
    successful one keeps it once, as the bound pod."""
    state = ready_state([gpu_node("n1", cards=2), gpu_node("n2", cards=2)],
                        SchedulerState(SchedulerConfig(node_policy="fgd", filter_result="all")))
    api = GatedApi()
    async with TestClient(TestServer(Extender(state, api).app())) as client:
        http = Http(client)
        nodes = ["n1", "n2"]
        # n2: one card taken by a pod that asks for no CPU
        other = http_pod("other", **{"elasticgpu.io/gpu-core": "100"})
        await http.schedule(other, ["n2"])
        assert await http.bind(other, "n2") == ""

        hog = http_pod("hog", **{"elasticgpu.io/gpu-core": "100", "cpu": "63",
                                 "memory": "200Gi"})
        await http.schedule(hog, ["n1"])
        api.gates["hog"] = asyncio.Event()
        binding = asyncio.create_task(http.bind(hog, "n1"))
        await until(lambda: "uid-hog" in state.inflight())
        assert state.host_usage()["n1"] == (63_000, 200 * 1024)  # held while in flight
        # n1 and n2 now both have one idle card; only the hold tells them apart
        small = http_pod("a", **{"elasticgpu.io/gpu-core": "10", "cpu": "1"})
        during = await http.schedule(small, nodes)
        assert during["n1"] > during["n2"]
        api.gates["hog"].set()
        assert await binding == ""
        assert api.bound["hog"] == "n1"
        assert state.host_usage()["n1"] == (63_000, 200 * 1024)  # once, as the bound pod

        refused = http_pod("refused", **{"elasticgpu.io/gpu-core": "30", "cpu": "500m",
                                         "memory": "1Gi"})
        await http.schedule(refused, ["n2"])
        api.gates["refused"] = asyncio.Event()
        api.refuse.add("refused")
        binding = asyncio.create_task(http.bind(refused, "n2"))
        await until(lambda: "uid-refused" in state.inflight())
        assert state.host_usage()["n2"] == (500, 1024)
        api.gates["refused"].set()
        assert "forbidden" in await binding
        assert state.host_usage()["n2"] == (0, 0)  # the API refused: nothing held


def test_an_unknown_bind_outcome_holds_cpu_until_the_reservation_expires() -> None:
    clock = Clock()
    state = ready_state([gpu_node("n1")], SchedulerState(clock=clock))
    manifest = pod_manifest("p", uid="uid-p", containers={
        "main": {"elasticgpu.io/gpu-core": "20", "cpu": "3", "memory": "2Gi"}})
    request = parse_pod(manifest)  # what the HTTP path hands `reserve`
    token, _ = state.reserve(request, "uid-p", "n1")
    state.settle("uid-p", token, "unknown")
    assert state.engine.host_usage("n1") == (3000, 2048)
    clock.now += state.config.reservation_ttl_s + 1
    assert state.expire() == 1  # never showed up: released with its cards
    assert state.engine.host_usage("n1") == (0, 0)


# ---- waking pending pods ------------------------------------------------------------------


def turned_away(state: SchedulerState, pod: dict[str, Any], nodes: list[str]) -> None:
    """A filter call that finds no room for the pod (kube-scheduler then parks it)."""
    result = state.filter(pod_request_from_manifest(pod), pod["metadata"]["uid"], nodes)
    assert result.feasible == []


def woken(state: SchedulerState) -> list[tuple[str, str]]:
    return [(w.name, w.node) for w in state.wakeups()]


def test_a_pod_turned_away_is_woken_once_when_the_gpu_pod_in_its_way_goes() -> None:
    state = ready_state([gpu_node("n1")])
    holder = share_pod("holder", 100)
    bind(state, holder, "n1")
    waiting = share_pod("waiting", 100)
    turned_away(state, waiting, ["n1"])
    assert set(state.waiting()) == {"uid-waiting"}
    assert not state.wakeup_pending()
    assert woken(state) == []  # nothing freed yet
    state.forget_pod("uid-holder")  # deleted, or it terminated and left the pod watch
    assert state.wakeup_pending()  # the API worker link starts a round
    assert woken(state) == [("waiting", "n1")]
    assert not state.wakeup_pending()
    assert woken(state) == []  # once per freeing, not once per round
    # kube-scheduler retries it: it fits now and waits no more
    assert state.filter(pod_request_from_manifest(waiting), "uid-waiting", ["n1"]).feasible
    assert state.waiting() == {}


def test_a_freeing_wakes_only_pods_that_fit_and_only_as_many_as_fit() -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    holder = share_pod("holder", 100)
    bind(state, holder, "n1")
    bind(state, share_pod("other", 100), "n2")
    for name in ("w1", "w2", "w3"):
        turned_away(state, share_pod(name, 100), ["n1", "n2"])
    turned_away(state, share_pod("big", 100, memory=32768), ["n1", "n2"])  # no card that big
    state.forget_pod("uid-holder")
    assert woken(state) == [("w1", "n1")]  # one card freed: one whole-card pod woken
    assert woken(state) == []
    bind(state, share_pod("w1", 100), "n1")  # kube-scheduler retried it
    state.forget_pod("uid-other")  # the next freeing: the next in line
    assert woken(state) == [("w2", "n2")]


def test_a_pod_bound_or_deleted_waits_no_more() -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    bind(state, share_pod("holder", 100), "n1")
    for name in ("bound", "deleted"):
        turned_away(state, share_pod(name, 100), ["n1"])  # kube-scheduler sent only n1
    bind(state, share_pod("bound", 100), "n2")  # bound elsewhere (another scheduler, by hand)
    state.forget_pod("uid-deleted")
    assert state.waiting() == {}
    state.forget_pod("uid-holder")
    assert woken(state) == []


def test_a_card_turning_healthy_or_arriving_late_wakes_the_pods_that_fit_it() -> None:
    from dataclasses import replace

    from elastic_gpu.api.gpudevice import object_name
    from elastic_gpu.core.model import Health

    sick = Node("n1", 64_000, 256_000, (Card(0, "GPU-n1-0", "T4", 16384,
                                             health=Health.UNHEALTHY),))
    state = ready_state([sick])
    state.upsert_node(NodeInfo("n2", 64_000, 256_000))  # a node whose GPUDevices are not in yet
    turned_away(state, share_pod("a", 100), ["n1", "n2"])
    turned_away(state, share_pod("b", 100), ["n1", "n2"])
    state.upsert_device(object_name("n1", 0), "n1", replace(sick.cards[0], health=Health.HEALTHY))
    assert woken(state) == [("a", "n1")]
    bind(state, share_pod("a", 100), "n1")
    state.upsert_device(object_name("n2", 0), "n2", Card(0, "GPU-n2-0", "T4", 16384))
    assert woken(state) == [("b", "n2")]


def test_a_refused_bind_gives_back_what_it_held_and_wakes_who_waited_for_it() -> None:
    state = ready_state([gpu_node("n1")])
    binding = share_pod("binding", 100)
    token, _ = state.reserve(pod_request_from_manifest(binding), "uid-binding", "n1")
    turned_away(state, share_pod("waiting", 100), ["n1"])
    state.settle("uid-binding", token, "failed")
    assert woken(state) == [("waiting", "n1")]


def test_a_wakeup_that_may_not_have_landed_is_sent_again_and_a_refused_one_ends_the_wait(
        ) -> None:
    state = ready_state([gpu_node("n1")])
    bind(state, share_pod("holder", 100), "n1")
    turned_away(state, share_pod("waiting", 100), ["n1"])
    state.forget_pod("uid-holder")
    (wake,) = state.wakeups()
    state.wakeup_done(wake, sent=False, definite=False)  # a timeout: it may not have landed
    assert woken(state) == [("waiting", "n1")]
    assert woken(state) == []
    state.wakeup_done(wake, sent=False, definite=True)  # the pod is gone: it waits no more
    assert state.waiting() == {}
    assert state.wakeup_stats()[1]["failed"] == 2


def test_wakeups_show_in_the_metrics() -> None:
    from prometheus_client import generate_latest

    from elastic_gpu.scheduler.metrics import Metrics

    state = ready_state([gpu_node("n1")])
    bind(state, share_pod("holder", 100), "n1")
    turned_away(state, share_pod("waiting", 100), ["n1"])
    metrics = Metrics(state.card_usage, wakeups=state.wakeup_stats)
    text = generate_latest(metrics.registry).decode()
    assert "elasticgpu_scheduler_waiting_pods 1.0" in text
    assert "elasticgpu_scheduler_turned_away_total 1.0" in text
    state.forget_pod("uid-holder")
    (wake,) = state.wakeups()
    state.wakeup_done(wake, sent=True)
    text = generate_latest(metrics.registry).decode()
    assert 'elasticgpu_scheduler_wakeups_total{result="sent"} 1.0' in text
    assert "elasticgpu_scheduler_wakeup_rounds_total 1.0" in text


def test_a_pod_deleted_before_its_bind_settles_stays_gone() -> None:
    """The Binding lands, the user deletes the pod at once, and the watch's DELETED reaches
    the state before the bind's own reply does: settling must not bring the pod back and hold
    its card for ever (seen by bench/sched_wakeup.py)."""
    state = ready_state([gpu_node("n1")])
    pod = share_pod("p", 100)
    token, assignment = state.reserve(pod_request_from_manifest(pod), "uid-p", "n1")
    state.forget_pod("uid-p")
    state.settle("uid-p", token, "bound", with_binding(pod, "n1", assignment))
    assert used(state, "n1") == 0
    assert state.pod("uid-p") is None
    state.observe_pod(annotated(pod, assignment, rv=50, node_name="n1"))  # a late read-back
    assert used(state, "n1") == 0


def test_the_http_path_builds_the_request_the_state_tests_feed() -> None:
    """filter/prioritize parse the pod kube-scheduler sends, bind the watch's slim copy; both
    give exactly `pod_request_from_manifest` (what these tests and `egpu simulate` use), CPU
    and memory included as kube-scheduler counts them (init containers, overhead)."""
    from egpu_testing.workbench import STYLES
    from elastic_gpu.scheduler.slim import slim_pod

    for style, limits in STYLES.items():
        pod = http_pod(style, **limits, cpu="2", memory="3Gi")
        pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "resources": {
            "requests": {"cpu": "4", "memory": "1Gi"}}}]
        pod["spec"]["overhead"] = {"cpu": "250m", "memory": "128Mi"}
        pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                                                             "status": "False"}]}
        expected = pod_request_from_manifest(pod)
        assert (expected.cpu_milli, expected.memory_mib) == (4250, 3072 + 128), style
        assert parse_pod(pod) == expected, style
        assert parse_pod(slim_pod(pod)) == expected, style


def test_a_pod_seen_while_its_node_changes_is_counted_before_the_next_decision() -> None:
    """A bound pod observed while its node's inventory waits for the flush (at start, at a
    relist, when a GPUDevice changed) is not counted against the old cards: it waits as a
    conflict, and the flush every decision begins with counts it, so no reserve can take its
    card in between."""
    first = share_pod("a", 70)
    assignment = bind(ready_state([gpu_node("n1", 1)]), first, "n1")  # bound by another replica
    state = ready_state([gpu_node("n1", 1)])
    # the node's card changes (a GPUDevice update), and before any decision the pod is seen
    state.upsert_device(object_name("n1", 0), "n1", Card(0, "GPU-n1-0", "T4", 32768))
    state.observe_pod(annotated(first, assignment, node_name="n1"))
    with pytest.raises(Unschedulable):  # the reserve flushes first: the 70% are counted
        state.reserve(pod_request_from_manifest(share_pod("b", 60)), "uid-b", "n1")
    assert used(state, "n1") == 700
    assert state.holds()["uid-a"] == assignment


def test_pod_shares_are_the_holds_at_the_call_and_leave_out_pods_deleted_meanwhile() -> None:
    """The metrics page reads the pods' shares between other work: the holds are copied at
    the call (a pod bound later is not listed), each pod's name is read as it is reached (a
    pod deleted by then is left out, never listed with a name it no longer has)."""
    state = ready_state([gpu_node("n1", cards=2)])
    first = bind(state, share_pod("a", 30), "n1")
    bind(state, share_pod("b", 30), "n1")
    shares = state.pod_shares()
    state.forget_pod("uid-b")
    bind(state, share_pod("c", 30), "n1")
    assert list(shares) == [("default", "a", first)]
