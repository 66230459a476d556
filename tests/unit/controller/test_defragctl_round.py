"""The defragmentation controller's round over fixed caches (`egpu_testing.defrag`): what it
plans, evicts, reports, refuses and waits for. The planner is the real one
(`core.defrag.plan`); the API server's part is the integration test's."""

from __future__ import annotations

import asyncio
from typing import Any

from egpu_testing.defrag import (
    EvictionClient,
    StaticInformers,
    gpu_pod,
    mig_node_objects,
    mig_pod,
    node_objects,
)
from elastic_gpu.controller.config import ControllerConfig, DefragConfig, DefragMode
from elastic_gpu.controller.defrag.cluster import read_cluster
from elastic_gpu.controller.defrag.controller import DefragController
from elastic_gpu.controller.manager import Context, Metrics
from elastic_gpu.controller.provisioning import ExtenderClient
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.defrag.record import PlanRecord
from elastic_gpu.core.defrag.reservation import DefragReservation
from elastic_gpu.kube.errors import ApiError
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import GPUDEVICES, NODES, PODS

NODES_4 = ("n0", "n1", "n2", "n3")


def make(config: DefragConfig, pods: list[dict[str, Any]], nodes: tuple[str, ...] = NODES_4
         ) -> tuple[DefragController, EvictionClient, list[tuple[str, str, str]]]:
    client = EvictionClient()
    informers = StaticInformers()
    recorder = EventRecorder(client, "test")  # type: ignore[arg-type]
    events: list[tuple[str, str, str]] = []
    recorder.record = lambda obj, _t, reason, message: events.append(  # type: ignore[method-assign]
        (obj["metadata"]["name"], reason, message))
    ctx = Context(client, informers, recorder, Metrics(),  # type: ignore[arg-type]
                  ExtenderClient("http://127.0.0.1:1"), "test",
                  config=ControllerConfig(defrag=config))
    controller = DefragController(ctx)
    for name in nodes:
        node, device = node_objects(name)
        informers.informer(NODES.path(), "").objects.append(node)
        informers.informer(GPUDEVICES.path(), "").objects.append(device)
    informers.informer(PODS.path(), "").objects.extend(pods)
    return controller, client, events


def run_round(controller: DefragController, now: float) -> None:
    asyncio.run(controller.round(now))


MOVE = DefragConfig(enabled=True, mode=DefragMode.MOVE)


def fragmented() -> list[dict[str, Any]]:
    """n0: a 30 + b 30; n1: c 40; n2: a bare pod 70; n3: d 60. A whole card is pending."""
    return [gpu_pod("a", percent=30, node="n0"), gpu_pod("b", percent=30, node="n0"),
            gpu_pod("c", percent=40, node="n1"), gpu_pod("bare", percent=70, node="n2",
                                                         owner=None),
            gpu_pod("d", percent=60, node="n3"), gpu_pod("whole", percent=None)]


def test_the_cluster_reader_counts_what_the_pods_hold() -> None:
    controller, _, _ = make(MOVE, fragmented())
    cluster = read_cluster(controller.devices.items(), controller.nodes.items(),
                           controller.pods.items(), [])
    assert sorted(cluster.placed) == ["ml/a", "ml/b", "ml/bare", "ml/c", "ml/d"]
    assert [u[1] for u in cluster.engine.card_usage("n0")] == [600]


def test_move_mode_evicts_the_fewest_shares_and_tells_both_pods() -> None:
    controller, client, events = make(MOVE, fragmented())
    run_round(controller, 1000.0)
    assert client.evicted == ["ml/c"]  # one move (c to n0 or n3), not a and b
    registry = controller.ctx.metrics.registry
    assert registry.get_sample_value("elasticgpu_defrag_evictions_total", {"result": "moved"}) == 1
    assert registry.get_sample_value("elasticgpu_defrag_plans_total",
                                     {"outcome": "carried_out"}) == 1
    assert registry.get_sample_value("elasticgpu_defrag_pending_pods") == 1
    reasons = {(name, reason) for name, reason, _ in events}
    assert reasons == {("c", "DefragMoved"), ("whole", "DefragMadeRoom")}
    # settling: the pending pod is not bound yet, so no second plan
    run_round(controller, 1001.0)
    assert client.evicted == ["ml/c"]
    # past the settle time, c's owner still cools down: c's replacement is not moved
    controller.pods.objects = [p for p in fragmented() if p["metadata"]["name"] != "c"] + [
        gpu_pod("c2", percent=40, node="n0")]
    controller.pods.objects[-1]["metadata"]["ownerReferences"][0]["uid"] = "rs-c"
    run_round(controller, 1000.0 + MOVE.settle_s + 1)
    assert "ml/c2" not in client.evicted


def test_report_mode_only_tells_the_plan() -> None:
    controller, client, events = make(DefragConfig(enabled=True), fragmented())
    run_round(controller, 1000.0)
    run_round(controller, 1005.0)
    assert not client.evicted and not client.refused
    assert [(n, r) for n, r, _ in events] == [("whole", "DefragPlanned")] * 2
    assert "would move 1 pod(s): ml/c from node n1 card 0" in events[0][2]


def test_off_by_default_and_per_namespace() -> None:
    controller, client, events = make(DefragConfig(), fragmented())
    run_round(controller, 1000.0)
    assert not client.evicted and not events
    other = DefragConfig(enabled=True, mode=DefragMode.MOVE, namespaces=["team"])  # type: ignore[arg-type]
    controller, client, events = make(other, fragmented())
    run_round(controller, 1000.0)
    assert not client.evicted and not events


def test_a_pdb_refusal_is_told_once_and_the_next_plan_goes_without_that_pod() -> None:
    controller, client, events = make(MOVE, fragmented())
    client.refuse = {"ml/c"}
    run_round(controller, 1000.0)
    assert client.refused == ["ml/c"] and not client.evicted
    assert controller.ctx.metrics.registry.get_sample_value(
        "elasticgpu_defrag_evictions_total", {"result": "refused"}) == 1
    assert {(n, r) for n, r, _ in events} == {("whole", "DefragEvictionRefused"),
                                              ("c", "DefragEvictionRefused")}
    run_round(controller, 1005.0)
    assert client.refused == ["ml/c"]  # never knocked again within the cool-down
    assert sorted(client.evicted) in (["ml/a", "ml/b"], ["ml/d"])


def test_never_a_bare_pod_nor_one_of_higher_priority() -> None:
    # the only single move would be the bare pod's or the important one's
    pods = [gpu_pod("bare", percent=40, node="n0", owner=None),
            gpu_pod("vip", percent=40, node="n1", priority=100),
            gpu_pod("whole", percent=None, priority=10)]
    controller, client, events = make(MOVE, pods, nodes=("n0", "n1"))
    run_round(controller, 1000.0)
    assert not client.evicted and not client.refused and not events


def test_rate_limits_hold_a_plan_whole() -> None:
    pods = [gpu_pod("a", percent=30, node="n0"), gpu_pod("b", percent=30, node="n0"),
            gpu_pod("c", percent=40, node="n1"), gpu_pod("whole", percent=None)]
    limited = DefragConfig(enabled=True, mode=DefragMode.MOVE, max_moves_per_node=1)
    controller, client, events = make(limited, pods, nodes=("n0", "n1"))
    # freeing n1 moves c to n0 (one move); n0 would take a and b (two from one node)
    run_round(controller, 1000.0)
    assert client.evicted == ["ml/c"]
    # c stays (not opted in): the only plan moves a and b, two from one node
    pods[2] = gpu_pod("c", percent=40, node="n1", movable=False)
    controller, client, events = make(limited, pods, nodes=("n0", "n1"))
    run_round(controller, 1000.0)
    assert not client.evicted
    assert [(n, r) for n, r, _ in events] == [("whole", "DefragRateLimited")]
    assert "per-node limit of 1" in events[0][2]


def test_a_plan_kube_scheduler_would_not_follow_is_not_carried_out() -> None:
    # c may only run on n1 (its node selector): moving it frees n1 in the Engine, never in
    # the cluster; the plan is dropped, nothing is evicted
    pods = fragmented()
    pods[2]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n1"}
    controller, client, events = make(MOVE, pods)
    for node in controller.nodes.objects:
        node["metadata"]["labels"] = {"kubernetes.io/hostname": node["metadata"]["name"]}
    run_round(controller, 1000.0)
    assert not client.evicted and not events
    # the same plan without the selector is carried out
    del pods[2]["spec"]["nodeSelector"]
    run_round(controller, 1001.0)
    assert client.evicted == ["ml/c"]


def test_a_pod_that_fits_as_things_are_is_left_to_the_scheduler() -> None:
    pods = [gpu_pod("a", percent=30, node="n0"), gpu_pod("whole", percent=None)]
    controller, client, events = make(MOVE, pods, nodes=("n0", "n1"))
    run_round(controller, 1000.0)
    assert not client.evicted and not events


def test_the_reader_trusts_only_assignments_a_binding_wrote() -> None:
    forged = gpu_pod("forged", percent=90, node="n1")
    forged["metadata"]["annotations"]["elasticgpu.io/assigned-node"] = "n0"  # not its node
    unbound = gpu_pod("unbound", percent=90, node="n1")
    del unbound["spec"]["nodeName"]
    done = gpu_pod("done", percent=90, node="n1")
    done["status"]["phase"] = "Succeeded"
    controller, _, _ = make(MOVE, [forged, unbound, done], nodes=("n0", "n1"))
    cluster = read_cluster(controller.devices.items(), controller.nodes.items(),
                           controller.pods.items(), [])
    assert cluster.placed == {}
    assert [u[1] for u in cluster.engine.card_usage("n1")] == [0]


def test_settling_ends_when_the_pod_binds_or_its_time_is_up() -> None:
    pods = fragmented()
    controller, client, _ = make(MOVE, pods)
    run_round(controller, 1000.0)
    assert client.evicted == ["ml/c"] and controller.state.in_flight is not None
    whole = pods[-1]
    whole["spec"]["nodeName"] = "n1"  # bound: the next round may plan again
    assert controller._settled(controller.pods.items(), 1001.0)
    assert controller.state.in_flight is None
    run_round(controller, 1002.0)  # nothing waits any more
    assert client.evicted == ["ml/c"]


def test_the_freed_cards_are_reserved_for_the_pending_pod_before_anything_moves() -> None:
    controller, client, _ = make(MOVE, fragmented())
    controller.wall_clock = lambda: 1_800_000_000.0
    run_round(controller, 1000.0)
    assert client.writes == [("patch", "ml/whole"), ("evict", "ml/c")]
    (key, patch), = client.patched
    meta = patch["metadata"]
    assert key == "ml/whole" and meta["uid"] == "uid-whole"  # the pod the plan was made for
    reservation = DefragReservation.from_json(meta["annotations"][ann.DEFRAG_RESERVATION])
    assert reservation.expires == 1_800_000_000.0 + MOVE.reservation_s
    assert reservation.assignment.node == "n1"  # where c is moved away from
    assert [s.milli for s in reservation.assignment.shares()] == [1000]


def test_no_reservation_no_move() -> None:
    controller, client, events = make(MOVE, fragmented())
    client.patch_error = ApiError(403, "Forbidden", "pods is forbidden")
    run_round(controller, 1000.0)
    assert not client.evicted and controller.state.in_flight is None
    assert [(n, r) for n, r, _ in events] == [("whole", "DefragReservationFailed")]


def mig_cluster() -> tuple[DefragController, EvictionClient, list[tuple[str, str, str]]]:
    """m0 and m1, one A100 carved into two 3g.40gb each: m on m0, a bare pod on m1; `pair`
    (two 3g.40gb) is pending though two instances are free, one on each node."""
    pods = [mig_pod("m", profile="3g.40gb", node="m0", instances=(0,)),
            mig_pod("keep", profile="3g.40gb", node="m1", instances=(0,), owner=None),
            mig_pod("pair", profile="3g.40gb", count=2)]
    controller, client, events = make(MOVE, pods, nodes=())
    for name in ("m0", "m1"):
        node, device = mig_node_objects(name, ("3g.40gb", "3g.40gb"))
        controller.nodes.objects.append(node)  # type: ignore[attr-defined]
        controller.devices.objects.append(device)  # type: ignore[attr-defined]
    return controller, client, events


def test_a_pending_mig_pod_gets_a_node_by_moving_a_holder_and_the_instances_are_reserved() -> None:
    controller, client, events = mig_cluster()
    controller.wall_clock = lambda: 1_800_000_000.0
    run_round(controller, 1000.0)
    assert client.writes == [("patch", "ml/pair"), ("evict", "ml/m")]  # never the bare pod
    ((key, patch),) = client.patched
    reservation = DefragReservation.from_json(
        patch["metadata"]["annotations"][ann.DEFRAG_RESERVATION])
    assert key == "ml/pair" and reservation.assignment.node == "m0"
    assert sorted(s.mig_uuid or "" for s in reservation.assignment.shares()) == [
        "MIG-m0-0", "MIG-m0-1"]
    moved = next(text for name, reason, text in events if reason == "DefragMoved")
    assert "the plan puts it on node m1 card 0 (MIG 3g.40gb MIG-m1-1)" in moved


def test_report_mode_names_the_mig_instances_a_plan_would_move() -> None:
    controller, client, events = mig_cluster()
    controller.config = DefragConfig(enabled=True)
    run_round(controller, 1000.0)
    assert client.writes == [("patch", "ml/pair")] and not client.evicted  # the plan record
    ((name, reason, text),) = events
    assert (name, reason) == ("pair", "DefragPlanned")
    assert ("would move 1 pod(s): ml/m from node m0 card 0 (MIG 3g.40gb MIG-m0-0) to node m1 "
            "card 0 (MIG 3g.40gb MIG-m1-1); then this pod fits on node m0 card 0 (MIG 3g.40gb "
            "MIG-m0-0, 3g.40gb MIG-m0-1)") in text


def recorded(client: EvictionClient, key: str) -> list[str | None]:
    """The plan record values the round patched on pod `key`, in order (None: removed)."""
    return [patch["metadata"]["annotations"].get(ann.DEFRAG_PLAN)
            for k, patch in client.patched if k == key and ann.DEFRAG_PLAN in
            patch["metadata"]["annotations"]]


def test_report_mode_records_the_plan_on_the_pod_once_per_change_and_removes_it_when_gone() -> None:
    controller, client, _ = make(DefragConfig(enabled=True), fragmented())
    controller.wall_clock = lambda: 1_800_000_000.0
    run_round(controller, 1000.0)
    (text,) = recorded(client, "ml/whole")
    assert text is not None
    record = PlanRecord.from_json(text)
    assert record.mode == "report" and record.at == 1_800_000_000.0
    assert [(m.pod, m.source.node) for m in record.moves] == [("ml/c", "n1")]
    assert record.placement.node == "n1"
    assert client.patched[0][1]["metadata"]["uid"] == "uid-whole"
    run_round(controller, 1005.0)  # the same plan: not written again
    assert len(recorded(client, "ml/whole")) == 1
    # c is gone (its node now free): whole fits as things are, the record is removed
    controller.pods.objects = [p for p in controller.pods.objects  # type: ignore[attr-defined]
                               if p["metadata"]["name"] != "c"]
    run_round(controller, 1010.0)
    assert recorded(client, "ml/whole") == [text, None]
    assert not client.evicted


def test_move_mode_writes_the_plan_record_with_the_reservation_in_one_patch() -> None:
    controller, client, _ = make(MOVE, fragmented())
    controller.wall_clock = lambda: 1_800_000_000.0
    run_round(controller, 1000.0)
    assert client.writes == [("patch", "ml/whole"), ("evict", "ml/c")]
    ((_, patch),) = client.patched
    notes = patch["metadata"]["annotations"]
    record = PlanRecord.from_json(notes[ann.DEFRAG_PLAN])
    reservation = DefragReservation.from_json(notes[ann.DEFRAG_RESERVATION])
    assert record.mode == "move" and record.placement == reservation.assignment
    assert [m.pod for m in record.moves] == ["ml/c"]


def test_a_failed_record_write_is_tried_again_on_the_next_round() -> None:
    controller, client, events = make(DefragConfig(enabled=True), fragmented())
    client.patch_error = ApiError(500, "InternalError", "etcd timeout")
    run_round(controller, 1000.0)
    assert not client.patched and [r for _, r, _ in events] == ["DefragPlanned"]
    client.patch_error = None
    run_round(controller, 1005.0)
    assert len(recorded(client, "ml/whole")) == 1


def test_move_mode_removes_the_record_of_a_plan_a_pdb_refused_when_no_other_exists() -> None:
    pods = [gpu_pod("c", percent=40, node="n0"), gpu_pod("bare", percent=50, node="n1",
                                                         owner=None),
            gpu_pod("whole", percent=None)]
    controller, client, _ = make(MOVE, pods, nodes=("n0", "n1"))
    client.refuse = {"ml/c"}
    run_round(controller, 1000.0)
    assert client.refused == ["ml/c"]
    (written,) = recorded(client, "ml/whole")
    assert written is not None and PlanRecord.from_json(written).mode == "move"
    run_round(controller, 1005.0)  # c cools down: no plan is left, nor its record
    assert recorded(client, "ml/whole") == [written, None]
    run_round(controller, 1010.0)  # removed once
    assert recorded(client, "ml/whole") == [written, None]
