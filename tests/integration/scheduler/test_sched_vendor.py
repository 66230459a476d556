"""The right vendor, and time-sliced replicas counted, on the real control plane.

A real kube-scheduler with the deploy/ extender stanza (every GPU name `ignoredByScheduler`)
beside an `egpu scheduler` subprocess; kwok nodes published through the agent's fake backend
with an agent configuration: NVIDIA nodes with the defaults, and an IX node whose agent
advertises `iluvatar.com/gpu` time-sliced 4 ways on 2 cards (capacity 8), as in issue 12.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.scenario import create_pods, pods_by_name, wait_bound, wait_extender_knows
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config, pod_manifest
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

IX = "iluvatar.com/gpu"
NV = "nvidia.com/gpu"
#: The IX agent of the report: resources.gpu iluvatar.com/gpu, timeSlicing.replicas 4.
IX_AGENT = {"resources": {"gpu": IX}, "timeSlicing": {"replicas": 4}}


class Setup:
    def __init__(self, extender: ExtenderProcess, scheduler_name: str, client: Any) -> None:
        self.extender = extender
        self.scheduler_name = scheduler_name
        self.client = client

    def wait_known(self, nodes: list[str], cards: int, timeout_s: float = 30.0) -> None:
        wait_extender_knows(self.extender.url, nodes, cards, timeout_s)


@pytest.fixture(params=["all", "best", "auto"])
def setup(request: pytest.FixtureRequest, k8s_cluster: Any,
          start_kube_scheduler: Callable[..., Any], tmp_path: Path) -> Iterator[Setup]:
    """Every extender configuration: filter + prioritize, filterResult best, and auto."""
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    client = k8s_cluster.client()
    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log",
                               config={"filterResult": request.param})
    extender.start()
    name = extender.scheduler_name
    start_kube_scheduler(extender_kube_scheduler_config(extender.url, name,
                                                        prioritize=request.param != "best"))
    try:
        yield Setup(extender, name, client)
    finally:
        extender.stop()



def wait_unschedulable(client: Any, namespace: str, name: str, words: str,
                       timeout_s: float = 30.0) -> str:
    """The pod's PodScheduled message once it names `words`; the pod must still be pending."""
    deadline = time.monotonic() + timeout_s
    message = ""
    while time.monotonic() < deadline:
        pod = pods_by_name(client, namespace)[name]
        assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec']['nodeName']}"
        conditions = (pod.get("status") or {}).get("conditions") or []
        message = " ".join(c.get("message") or "" for c in conditions
                           if c.get("type") == "PodScheduled" and c.get("status") == "False")
        if words in message:
            return message
        time.sleep(0.3)
    raise AssertionError(f"{name}: no PodScheduled message naming {words!r}; last: {message!r}")


def gpu_pods(prefix: str, count: int, namespace: str, scheduler: str, limits: dict[str, str]
             ) -> list[dict[str, Any]]:
    return [pod_manifest(f"{prefix}-{i}", namespace, limits=limits, scheduler_name=scheduler)
            for i in range(count)]


def assignment_of(pod: dict[str, Any]) -> Assignment:
    assignment = Assignment.from_json(pod["metadata"]["annotations"][ann.ASSIGNMENT])
    assert assignment.node == pod["spec"]["nodeName"]
    return assignment


def test_pods_land_only_on_nodes_that_offer_the_resource_they_name(
        setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str,
        k8s_cluster: Any) -> None:
    nvidia = fake_gpu_nodes(3, gpus=2, prefix="nv")
    (ix,) = fake_gpu_nodes(1, gpus=2, prefix="ix", gpu_model="BI-V100", gpu_memory_mib=32768,
                           agent_config=IX_AGENT)
    setup.wait_known([*nvidia, ix], 2)
    # The IX node is published as its agent would: 8 replicas, 4 per card.
    capacity = k8s_cluster.kubectl("get", "node", ix, "-o",
                                   "jsonpath={.status.capacity.iluvatar\\.com/gpu}").stdout
    assert capacity.strip() == "8"
    per_card = k8s_cluster.kubectl("get", "gpud", f"{ix}-gpu0", "-o",
                                   "jsonpath={.spec.resources.iluvatar\\.com/gpu}").stdout
    assert per_card.strip() == "4"
    assert NV not in k8s_cluster.kubectl("get", "node", ix, "-o",
                                         "jsonpath={.status.capacity}").stdout

    ix_pods = gpu_pods("ix", 8, k8s_namespace, setup.scheduler_name, {IX: "1"})
    nv_pods = gpu_pods("nv", 6, k8s_namespace, setup.scheduler_name, {NV: "1"})
    create_pods(setup.client, ix_pods + nv_pods)
    bound = wait_bound(setup.client, k8s_namespace,
                       [p["metadata"]["name"] for p in ix_pods + nv_pods])
    on = {name: pod["spec"]["nodeName"] for name, pod in bound.items()}
    assert {on[f"ix-{i}"] for i in range(8)} == {ix}
    assert {on[f"nv-{i}"] for i in range(6)} <= set(nvidia)  # never the IX node

    # A 9th IX pod: the NVIDIA nodes have free cards, but none offers iluvatar.com/gpu.
    create_pods(setup.client, gpu_pods("ix-extra", 1, k8s_namespace, setup.scheduler_name,
                                       {IX: "1"}))
    message = wait_unschedulable(setup.client, k8s_namespace, "ix-extra-0",
                                 f"does not offer {IX}")
    assert IX in message
    # and the NVIDIA cards are all taken: one more nvidia.com/gpu pod does not go to the IX node
    create_pods(setup.client, gpu_pods("nv-extra", 1, k8s_namespace, setup.scheduler_name,
                                       {NV: "1"}))
    wait_unschedulable(setup.client, k8s_namespace, "nv-extra-0", f"does not offer {NV}")


def test_time_sliced_replicas_are_counted_exactly(
        setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    (ix,) = fake_gpu_nodes(1, gpus=2, prefix="ix", gpu_model="BI-V100", gpu_memory_mib=32768,
                           agent_config=IX_AGENT)
    setup.wait_known([ix], 2)
    # two replicas in one container go on distinct cards
    create_pods(setup.client, gpu_pods("pair", 1, k8s_namespace, setup.scheduler_name,
                                       {IX: "2"}))
    pair = assignment_of(wait_bound(setup.client, k8s_namespace, ["pair-0"])["pair-0"])
    assert sorted((s.index, s.replicas, s.milli) for s in pair.shares()) == [
        (0, 1, 250), (1, 1, 250)]
    # six single replicas fill the node's 8 exactly (the report: the third was refused)
    singles = gpu_pods("one", 6, k8s_namespace, setup.scheduler_name, {IX: "1"})
    create_pods(setup.client, singles)
    bound = wait_bound(setup.client, k8s_namespace, [p["metadata"]["name"] for p in singles])
    per_card: dict[int, int] = {0: 1, 1: 1}
    for i in range(6):
        (share,) = assignment_of(bound[f"one-{i}"]).shares()
        assert share.replicas == 1 and share.milli == 250 and share.memory_mib == 0
        per_card[share.index] += 1
    assert per_card == {0: 4, 1: 4}
    # the 9th replica is refused with a reason naming the resource
    create_pods(setup.client, gpu_pods("ninth", 1, k8s_namespace, setup.scheduler_name,
                                       {IX: "1"}))
    message = wait_unschedulable(setup.client, k8s_namespace, "ninth-0", IX)
    assert "0 of 8 iluvatar.com/gpu time-sliced replicas are free" in message
    # and a compute share finds no room on cards whose replicas hold all their compute
    create_pods(setup.client, gpu_pods("share", 1, k8s_namespace, setup.scheduler_name,
                                       {"elasticgpu.io/gpu-core": "10"}))
    wait_unschedulable(setup.client, k8s_namespace, "share-0", "10% compute")
