"""The extender with sidecars (KEP-753): what it reads of them survives the wire and the API
worker's slim form, a bound pod's sidecar holds its CPU in the engine's view of the node beside
the containers', and a sidecar's GPU share gets cards of its own."""

from __future__ import annotations

import json
from typing import Any

from egpu_testing.sidecars import with_init_container
from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_host_requests, pod_request_from_manifest
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.slim import slim_pod

CORE = "elasticgpu.io/gpu-core"


def gpu_node(name: str, cards: int) -> Node:
    return Node(name, 64_000, 256_000, tuple(Card(i, f"GPU-{name}-{i}", "T4", 16384)
                                             for i in range(cards)))


def sidecar_pod(name: str, main: dict[str, str], sidecar: dict[str, str]) -> dict[str, Any]:
    return with_init_container(pod_manifest(name, uid=f"uid-{name}", containers={"main": main}),
                               "proxy", sidecar)


def test_a_sidecar_survives_the_wire_and_the_slim_form() -> None:
    pod = sidecar_pod("p", {CORE: "50", "cpu": "4"}, {CORE: "30", "cpu": "4"})
    args = wire.parse_args(json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode())
    for seen in (args.Pod, slim_pod(pod)):
        assert pod_host_requests(seen) == pod_host_requests(pod) == (8000, 0)
        assert pod_request_from_manifest(seen) == pod_request_from_manifest(pod)


def test_a_bound_pods_sidecar_holds_its_cpu_beside_the_containers() -> None:
    state = ready_state([gpu_node("n1", 1)])
    pod = sidecar_pod("web", {"cpu": "4", "memory": "1Gi"}, {"cpu": "4", "memory": "1Gi"})
    pod["metadata"]["resourceVersion"] = "5"
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {"phase": "Running"}
    state.observe_pod(pod)
    assert state.engine.host_usage("n1") == (8000, 2048)
    assert state.engine.node_view("n1").cpu_free == 64_000 - 8000


def test_a_sidecars_share_is_placed_on_cards_of_its_own() -> None:
    pod = sidecar_pod("p", {CORE: "60"}, {CORE: "60"})
    request = pod_request_from_manifest(pod)
    # two 60% shares do not fit one card together
    one_card = ready_state([gpu_node("n1", 1)])
    assert one_card.filter(request, "uid-p", ["n1"]).feasible == []
    state = ready_state([gpu_node("n1", 2)])
    assert state.filter(request, "uid-p", ["n1"]).feasible == ["n1"]
    token, assignment = state.reserve(request, "uid-p", "n1")
    state.settle("uid-p", token, "bound", with_binding(pod, "n1", assignment))
    assert sorted(assignment.containers) == ["main", "proxy"]
    (proxy,), (main,) = assignment.containers["proxy"], assignment.containers["main"]
    assert {proxy.index, main.index} == {0, 1}
    assert (proxy.milli, main.milli) == (600, 600)
    assert sorted(state.card_usage()["n1"]) == [(0, 600, 0), (1, 600, 0)]
