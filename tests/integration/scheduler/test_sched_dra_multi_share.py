"""Issue 40 on DRA nodes: a ResourceClaim asking `count: 2` with capacity is two shares on two
distinct cards of one node, placed by our allocator (kwok DRA-mode nodes publishing this
driver's slices, stock kube-scheduler binding), each device's `consumedCapacity` the share.

Two 2-card nodes: `count: 2` of 30 % packs onto both cards of one node; `count: 2` of 80 % then
fits only the other node (70 % is left on each card of the first), never two shares of one
card; a third 80 % x 2 waits gated until the second's pod and claim are gone, then takes its
cards."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra import claim_manifest, gated_claim_pod
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.workbench import ExtenderProcess, plain_kube_scheduler_config, running_extender
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.kube.resources import PODS, RESOURCE_CLAIMS

pytestmark = pytest.mark.integration

GROUP_LABEL = "test.elasticgpu.io/dra-multi"


@pytest.fixture
def extender(k8s_cluster: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    with running_extender(k8s_cluster, tmp_path, config={"nodePolicy": "binpack"},
                          start_timeout_s=120) as process:
        yield process


def _claim_and_pod(namespace: str, name: str, scheduler: str, group: str, count: int,
                   compute: str) -> tuple[dict[str, Any], dict[str, Any]]:
    claim = claim_manifest(name, namespace, capacity={"compute": compute, "memory": "8Gi"},
                           count=count)
    return claim, gated_claim_pod(name, namespace, scheduler, {GROUP_LABEL: group})


def _bound(kube: Any, namespace: str, name: str, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        node = (kube.get(PODS.path(namespace, name)).get("spec") or {}).get("nodeName")
        if node:
            return str(node)
        assert time.monotonic() < deadline, f"{name} not bound"
        time.sleep(0.2)


@pytest.mark.usefixtures("dra_device_classes")
def test_count_two_with_capacity_is_two_shares_on_two_distinct_cards(
        k8s_cluster: ControlPlane, k8s_namespace: str, extender: ExtenderProcess,
        fake_gpu_nodes: Callable[..., list[str]],
        start_kube_scheduler: Callable[..., Any]) -> None:
    kube = k8s_cluster.kube()
    group = unique_name("g")
    nodes = fake_gpu_nodes(2, gpus=2, labels={GPU_MODE_LABEL: "dra", GROUP_LABEL: group},
                           prefix="dra-multi")
    start_kube_scheduler(plain_kube_scheduler_config(extender.scheduler_name))
    placed: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for name, compute in (("small", "30"), ("big", "80")):
        claim, pod = _claim_and_pod(k8s_namespace, name, extender.scheduler_name, group, 2,
                                    compute)
        kube.create(RESOURCE_CLAIMS.path(k8s_namespace), claim)
        kube.create(PODS.path(k8s_namespace), pod)
        node = _bound(kube, k8s_namespace, name)
        got = kube.get(RESOURCE_CLAIMS.path(k8s_namespace, name))
        results = got["status"]["allocation"]["devices"]["results"]
        placed[name] = (node, results)
        # two devices, distinct cards of the pod's node, each holding the share asked
        assert len(results) == 2 and {r["pool"] for r in results} == {node}, results
        assert len({r["device"] for r in results}) == 2, results
        assert len({r["shareID"] for r in results}) == 2, results
        assert all(r["consumedCapacity"] == {"compute": compute, "memory": "8Gi"}
                   for r in results), results
    assert {placed["small"][0], placed["big"][0]} == set(nodes)
    # placed by our allocator, not handed over to kube-scheduler's
    assert "kube-scheduler's to place" not in extender.log_path.read_text()
    # a third 80 % x 2 has no room now but would on an empty node: it waits gated, ours to
    # place once room frees (handed over, kube-scheduler would have lifted the gate)
    claim, pod = _claim_and_pod(k8s_namespace, "later", extender.scheduler_name, group, 2, "80")
    kube.create(RESOURCE_CLAIMS.path(k8s_namespace), claim)
    kube.create(PODS.path(k8s_namespace), pod)
    time.sleep(2)
    assert kube.get(PODS.path(k8s_namespace, "later"))["spec"]["schedulingGates"] == [
        {"name": DRA_PLACEMENT_GATE}]
    kube.delete(PODS.path(k8s_namespace, "big"), grace_period_s=0)
    kube.delete(RESOURCE_CLAIMS.path(k8s_namespace, "big"))
    assert _bound(kube, k8s_namespace, "later") == placed["big"][0]
