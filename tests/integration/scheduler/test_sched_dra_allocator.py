"""Issue 41, the allocator: ResourceClaims of our card class placed by our engine on the real
control plane (kwok DRA-mode nodes publishing this driver's slices, stock kube-scheduler).

A pod carries the gate `elasticgpu.io/dra-placement` (as the webhook's `dra_gate` mutator puts
it); the extender's DRA allocator places its claim with the engine's binpack, writes the claim's
finalizer and allocation and lifts the gate; kube-scheduler binds the pod to that node. Four
half-card shares on two 2-card nodes go onto two cards of one node (kube-scheduler's own
allocator spreads by CPU and memory and takes devices first fit). A restarted allocator reads
every allocated claim as a fact: it gives the second whole card, never the first again, and
keeps a third whole-card pod gated while no card is free, and places it on the first one's card
once that pod and its claim are gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra import claim_manifest, gated_claim_pod
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from egpu_testing.workbench import ExtenderProcess, plain_kube_scheduler_config, running_extender
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.claim_placement import WAITING_REASON
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.kube.resources import EVENTS, PODS, RESOURCE_CLAIMS
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

GROUP_LABEL = "test.elasticgpu.io/dra-allocator"
#: seconds a pod may take to be placed and bound on a busy box
BIND_S = 90.0


@pytest.fixture
def extender(k8s_cluster: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    with running_extender(k8s_cluster, tmp_path, config={"nodePolicy": "binpack"},
                          start_timeout_s=120) as process:
        yield process


def _create(kube: SyncKubeClient, namespace: str, names: list[str], scheduler: str,
            group: str, capacity: dict[str, str] | None) -> None:
    for name in names:
        kube.create(RESOURCE_CLAIMS.path(namespace), claim_manifest(name, namespace,
                                                                    capacity=capacity))
        kube.create(PODS.path(namespace), gated_claim_pod(name, namespace, scheduler,
                                                          {GROUP_LABEL: group}))


def _bound(kube: SyncKubeClient, namespace: str, names: list[str]) -> dict[str, str] | None:
    pods = {p["metadata"]["name"]: p for p in kube.list(PODS.path(namespace))[0]}
    nodes = {n: (pods[n].get("spec") or {}).get("nodeName") for n in names if n in pods}
    return nodes if len(nodes) == len(names) and all(nodes.values()) else None


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                .get("results") or [])


def _nodes(fake_gpu_nodes: Callable[..., list[str]], count: int, group: str) -> list[str]:
    return fake_gpu_nodes(count, gpus=2, labels={GPU_MODE_LABEL: "dra", GROUP_LABEL: group},
                          prefix="dra-alloc")


@pytest.mark.usefixtures("dra_device_classes")
def test_gated_claim_pods_are_packed_by_our_engine_then_bound_by_kube_scheduler(
        k8s_cluster: ControlPlane, k8s_namespace: str, extender: ExtenderProcess,
        fake_gpu_nodes: Callable[..., list[str]],
        start_kube_scheduler: Callable[..., Any]) -> None:
    kube = k8s_cluster.kube()
    group = unique_name("g")
    nodes = _nodes(fake_gpu_nodes, 2, group)
    start_kube_scheduler(plain_kube_scheduler_config(extender.scheduler_name))
    names = [f"half-{i}" for i in range(4)]
    _create(kube, k8s_namespace, names, extender.scheduler_name, group,
            {"compute": "50", "memory": "4Gi"})
    bound = wait_for("the four pods bound", lambda: _bound(kube, k8s_namespace, names),
                     BIND_S)
    claims = {n: kube.get(RESOURCE_CLAIMS.path(k8s_namespace, n)) for n in names}
    used = {(r["pool"], r["device"]) for c in claims.values() for r in _results(c)}
    # packed: two cards of one node; the other node wholly free
    assert len(used) == 2 and len({node for node, _ in used}) == 1, used
    (node,) = {node for node, _ in used}
    assert node in nodes and set(bound.values()) == {node}
    for claim in claims.values():
        assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
        allocation = claim["status"]["allocation"]
        assert allocation["allocationTimestamp"]
        assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
            "values"] == [node]
        (result,) = _results(claim)
        assert result["consumedCapacity"] == {"compute": "50", "memory": "4Gi"}
        # kube-scheduler reserved the claim for its pod at PreBind
        assert [r["name"] for r in claim["status"]["reservedFor"]] == [
            claim["metadata"]["name"]]
    for name in names:
        pod = kube.get(PODS.path(k8s_namespace, name))
        assert not pod["spec"].get("schedulingGates")


@pytest.mark.usefixtures("dra_device_classes")
def test_a_restarted_allocator_reads_allocated_claims_and_gives_nothing_twice(
        k8s_cluster: ControlPlane, k8s_namespace: str, extender: ExtenderProcess,
        fake_gpu_nodes: Callable[..., list[str]],
        start_kube_scheduler: Callable[..., Any]) -> None:
    kube = k8s_cluster.kube()
    group = unique_name("g")
    (node,) = _nodes(fake_gpu_nodes, 1, group)
    start_kube_scheduler(plain_kube_scheduler_config(extender.scheduler_name))
    _create(kube, k8s_namespace, ["first"], extender.scheduler_name, group, None)
    wait_for("the first pod bound", lambda: _bound(kube, k8s_namespace, ["first"]), BIND_S)
    extender.kill()  # SIGKILL: nothing written on the way out
    _create(kube, k8s_namespace, ["second", "third"], extender.scheduler_name, group, None)
    extender.start(timeout_s=120)
    wait_for("the second pod bound", lambda: _bound(kube, k8s_namespace, ["second"]), BIND_S)
    devices = {n: [(r["pool"], r["device"]) for r in _results(
        kube.get(RESOURCE_CLAIMS.path(k8s_namespace, n)))] for n in ("first", "second")}
    assert sorted(d for ds in devices.values() for d in ds) == [(node, "gpu-0"), (node, "gpu-1")]
    # the third has no card to get: it waits gated (placed once room frees), nothing given
    time.sleep(2)
    third = kube.get(PODS.path(k8s_namespace, "third"))
    assert third["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]
    assert not _results(kube.get(RESOURCE_CLAIMS.path(k8s_namespace, "third")))
    # it says why, in one Event (several passes ran meanwhile: recorded once, not per pass)
    events = wait_for("the waiting Event", lambda: [
        e for e in kube.list(EVENTS.path(k8s_namespace))[0]
        if e["involvedObject"]["name"] == "third" and e["reason"] == WAITING_REASON], BIND_S)
    (event,) = events
    assert event["count"] == 1 and event["type"] == "Normal"
    assert event["message"].startswith("waiting, gated, for room on a DRA node: 0/1 nodes")
    kube.delete(PODS.path(k8s_namespace, "first"), grace_period_s=0)
    kube.delete(RESOURCE_CLAIMS.path(k8s_namespace, "first"))
    wait_for("the third pod bound once the first's card freed",
             lambda: _bound(kube, k8s_namespace, ["third"]), BIND_S)
    (got,) = [(r["pool"], r["device"]) for r in _results(
        kube.get(RESOURCE_CLAIMS.path(k8s_namespace, "third")))]
    assert got == devices["first"][0]
