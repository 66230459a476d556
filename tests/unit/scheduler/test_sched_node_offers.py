"""The extender's node view says what a node offers: from the Node's allocatable (so nodes of
older agents, whose GPUDevices lack spec.resources, are still vendor-checked) and from each
GPUDevice's spec.resources, through the same conversions the reflectors use."""

from __future__ import annotations

from typing import Any

from egpu_testing.workbench import pod_manifest
from elastic_gpu.api.gpudevice import card_to_object
from elastic_gpu.core.fit import FitKind
from elastic_gpu.core.model import Card
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.app import Feeds, node_info
from elastic_gpu.scheduler.state import SchedulerState


def k8s_node(name: str, gpu: dict[str, str]) -> dict[str, Any]:
    allocatable = {"cpu": "32", "memory": "64Gi", "pods": "110", **gpu}
    return {"metadata": {"name": name}, "status": {"capacity": dict(allocatable),
                                                   "allocatable": allocatable}}


def test_node_info_keeps_the_gpu_resources_of_allocatable_only() -> None:
    info = node_info(k8s_node("n", {"iluvatar.com/gpu": "8", "elasticgpu.io/gpu-memory": "64k",
                                    "example.com/fpga": "2", "nvidia.com/mig-3g.40gb": "bad"}))
    assert info.offers == {"iluvatar.com/gpu": 8, "elasticgpu.io/gpu-memory": 64000,
                           "nvidia.com/mig-3g.40gb": 0}
    assert info.cpu_milli == 32000


def state_of(nodes: list[dict[str, Any]], cards: dict[str, list[Card]]) -> SchedulerState:
    state = SchedulerState()
    feeds = Feeds(state)
    feeds.nodes_replace(nodes)
    feeds.devices_replace([card_to_object(node, card) for node, cs in cards.items() for card in cs])
    feeds.pods_replace([])
    for replace in (feeds.egpus_replace, feeds.claims_replace, feeds.classes_replace):
        replace([])  # the Elastic GPU API's CRDs: none exist
    return state


def test_gpudevices_of_an_older_agent_are_checked_against_the_node() -> None:
    old = {n: [Card(i, f"GPU-{n}-{i}", "T4", 16384) for i in range(2)] for n in ("nv", "ix")}
    state = state_of([k8s_node("nv", {"nvidia.com/gpu": "2"}),
                      k8s_node("ix", {"iluvatar.com/gpu": "8"})], old)
    pod = pod_manifest("p", limits={"iluvatar.com/gpu": "1"})
    result = state.filter(pod_request_from_manifest(pod), "uid-p", ["nv", "ix"])
    assert result.feasible == ["ix"]
    assert result.failed["nv"].kind is FitKind.RESOURCE_NOT_OFFERED
    assert result.failed["nv"].resource == "iluvatar.com/gpu"


def test_card_offers_from_spec_resources_count_replicas() -> None:
    cards = {"ix": [Card(i, f"GPU-ix-{i}", "BI-V100", 32768, offers={"iluvatar.com/gpu": 4})
                    for i in range(2)]}
    state = state_of([k8s_node("ix", {"iluvatar.com/gpu": "8"})], cards)
    for i in range(8):
        pod = pod_manifest(f"p{i}", limits={"iluvatar.com/gpu": "1"})
        _, assignment = state.reserve(pod_request_from_manifest(pod), f"uid-{i}", "ix")
        assert [s.replicas for s in assignment.shares()] == [1]
    ninth = pod_request_from_manifest(pod_manifest("p8", limits={"iluvatar.com/gpu": "1"}))
    assert state.filter(ninth, "uid-8", ["ix"]).feasible == []


def test_what_a_node_offers_comes_from_capacity_not_allocatable() -> None:
    """A node whose only card is unhealthy has allocatable 0 of everything it serves: it still
    offers those names (it is turned away as unhealthy, and woken when the card heals), while
    names it never advertised stay unoffered."""
    node = {"metadata": {"name": "sick"}, "status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "elasticgpu.io/gpu-core": "100",
                     "nvidia.com/gpu": "1"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "elasticgpu.io/gpu-core": "0",
                        "nvidia.com/gpu": "0"}}}
    info = node_info(node)
    assert info.offers == {"elasticgpu.io/gpu-core": 100, "nvidia.com/gpu": 1}
    assert info.cpu_milli == 8000  # host resources still come from allocatable
