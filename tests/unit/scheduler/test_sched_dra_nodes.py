"""The extender and DRA-mode nodes (`core.dra.nodemode`): filter passes them for names a
DeviceClass serves and refuses the rest, never counting cards there; bind writes the Binding
alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState

DP = Node("dp", 64_000, 256_000, (Card(0, "GPU-dp-0", "A100", 81920),))


class Api:
    def __init__(self) -> None:
        self.bound: list[tuple[str, str, dict[str, str]]] = []

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        self.bound.append((name, node, dict(annotations)))


def _state() -> SchedulerState:
    state = ready_state([DP])
    for name in ("dra-a", "dra-b"):
        state.upsert_node(NodeInfo(name, 64_000, 256_000, {GPU_MODE_LABEL: "dra"}))
    return state


def _filter(ext: Extender, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    return dict(json.loads(ext.filter(body).text))


def test_filter_passes_dra_nodes_for_nvidia_gpu_and_places_the_rest_as_before() -> None:
    ext = Extender(_state())
    pod = pod_manifest("whole", uid="u1", limits={"nvidia.com/gpu": "1"})
    body = _filter(ext, pod, ["dp", "dra-a", "dra-b"])
    assert sorted(body["NodeNames"]) == ["dp", "dra-a", "dra-b"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    # no card was counted on a DRA node: the state knows none there
    assert ext.state.cards()["dra-a"] == () and ext.state.holds() == {}


def test_filter_refuses_dra_nodes_for_fractions_naming_the_class() -> None:
    ext = Extender(_state())
    pod = pod_manifest("share", uid="u2", limits={"elasticgpu.io/gpu-core": "30"})
    body = _filter(ext, pod, ["dp", "dra-a"])
    assert body["NodeNames"] == ["dp"]
    reason = body["FailedAndUnresolvableNodes"]["dra-a"]
    assert reason.startswith("the node serves GPUs through DRA; ask for a share with a "
                             "ResourceClaim of class gpu.elasticgpu.io")
    mig = pod_manifest("mig", uid="u3", limits={"nvidia.com/mig-1g.10gb": "1"})
    body = _filter(ext, mig, ["dra-a", "dra-b"])
    assert body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == {"dra-a", "dra-b"}


def test_prioritize_scores_dra_nodes_zero() -> None:
    ext = Extender(_state())
    pod = pod_manifest("whole", uid="u4", limits={"nvidia.com/gpu": "1"})
    body = json.loads(ext.prioritize(json.dumps({"Pod": pod, "NodeNames": ["dp", "dra-a"]})
                                     .encode()).text)
    assert {h["Host"]: h["Score"] for h in body}["dra-a"] == 0


def test_preempt_keeps_kube_schedulers_victims_on_a_dra_node_it_may_use() -> None:
    ext = Extender(_state())
    pod = pod_manifest("whole", uid="u5", limits={"nvidia.com/gpu": "1"})
    body = {"Pod": pod, "NodeNameToMetaVictims": {
        "dra-a": {"Pods": [{"UID": "victim"}], "NumPDBViolations": 0}}}
    answer = json.loads(ext.preempt(json.dumps(body).encode()).text)
    assert answer["NodeNameToMetaVictims"]["dra-a"]["Pods"] == [{"UID": "victim"}]
    share = pod_manifest("share", uid="u6", limits={"elasticgpu.io/gpu-core": "30"})
    answer = json.loads(ext.preempt(json.dumps({**body, "Pod": share}).encode()).text)
    assert "dra-a" not in (answer["NodeNameToMetaVictims"] or {})


def _bind(ext: Extender, pod: dict[str, Any], node: str) -> dict[str, Any]:
    ext.state.observe_pod(pod)
    meta = pod["metadata"]
    body = json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                       "PodUID": meta["uid"], "Node": node}).encode()
    return dict(json.loads(asyncio.run(ext.bind(body)).text))


def test_bind_to_a_dra_node_writes_the_binding_without_assignment_or_reservation() -> None:
    api = Api()
    ext = Extender(_state(), api)
    pod = pod_manifest("whole", uid="u7", limits={"nvidia.com/gpu": "1"})
    pod["metadata"]["resourceVersion"] = "3"
    assert _bind(ext, pod, "dra-a") == {"Error": ""}
    assert api.bound == [("whole", "dra-a", {})]
    assert ext.state.inflight() == {} and ext.state.holds() == {}
    # a device-plugin node still gets its assignment
    other = pod_manifest("dp-pod", uid="u8", limits={"nvidia.com/gpu": "1"})
    other["metadata"]["resourceVersion"] = "4"
    assert _bind(ext, other, "dp") == {"Error": ""}
    assert "elasticgpu.io/assignment" in api.bound[-1][2]


def test_bind_refuses_what_a_dra_node_cannot_serve() -> None:
    api = Api()
    ext = Extender(_state(), api)
    pod = pod_manifest("share", uid="u9", limits={"elasticgpu.io/gpu-core": "30"})
    pod["metadata"]["resourceVersion"] = "3"
    answer = _bind(ext, pod, "dra-b")
    assert "serves GPUs through DRA" in answer["Error"]
    assert api.bound == []


def test_bind_takes_a_claim_pod_sent_for_its_quota_names_on_a_dra_node_only() -> None:
    """The webhook puts the quota's accounting names (managed resources) on a claim pod, so
    kube-scheduler sends it to our bind once its claims are allocated (issue 41)."""
    api = Api()
    ext = Extender(_state(), api)
    pod = pod_manifest("claimed", uid="u10", limits={"quota.elasticgpu.io/gpu-core": "100"})
    pod["metadata"]["resourceVersion"] = "3"
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "whole"}]
    assert _bind(ext, pod, "dra-a") == {"Error": ""}
    assert api.bound == [("claimed", "dra-a", {})]
    assert ext.state.inflight() == {} and ext.state.holds() == {}
    # on a device-plugin node, and without claims, it is no pod of ours to bind
    elsewhere = {**pod, "metadata": {**pod["metadata"], "name": "dp", "uid": "u11"}}
    assert "asks for no GPU resource" in _bind(ext, elsewhere, "dp")["Error"]
    plain = pod_manifest("plain", uid="u12", limits={"quota.elasticgpu.io/gpu-core": "100"})
    plain["metadata"]["resourceVersion"] = "3"
    assert "asks for no GPU resource" in _bind(ext, plain, "dra-b")["Error"]
    assert len(api.bound) == 1


def test_a_node_leaving_dra_mode_is_placed_by_cards_again() -> None:
    state = _state()
    state.upsert_node(NodeInfo("dra-a", 64_000, 256_000, {}))
    assert state.dra_nodes(["dra-a", "dra-b"]) == {"dra-b"}
    state.remove_node("dra-b")
    assert state.dra_nodes(["dra-a", "dra-b"]) == set()


def test_a_pod_no_dra_node_can_serve_counts_as_unschedulable_for_dra() -> None:
    ext = Extender(_state())
    pod = pod_manifest("share", uid="u10", limits={"elasticgpu.io/gpu-core": "30"})
    _filter(ext, pod, ["dra-a", "dra-b"])
    assert ext.metrics.unschedulable.labels("dra")._value.get() == 1
