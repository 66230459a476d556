"""Pending pods wake up when GPU capacity frees; a bind in flight holds its CPU and memory.

Real kube-scheduler v1.36 + `egpu scheduler` + kwok nodes. kube-scheduler retries a pod its
extender turned away on any cluster event, but GPU capacity can free where it sees none (a card
turns healthy) or where it sees the event before the extender does (a GPU pod deleted: it
retries at once and the extender, its watch behind, turns the pod away again). Pausing the
extender's API worker (SIGSTOP) makes the second case certain instead of a matter of timing.
Without the wake-up, the pod waits for kube-scheduler's five-minute flush; the tests allow 20 s.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import create_pods, list_pods
from egpu_testing.workbench import (
    ExtenderProcess,
    api_worker_pid,
    extender_kube_scheduler_config,
    metric_value,
    metrics_text,
    paused,
    pod_manifest,
)
from elastic_gpu.core.model import Card, Health, Node
from elastic_gpu.devcluster.nodes import register_fake_nodes, unregister_fake_node
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

#: Far below kube-scheduler's five-minute flush of unschedulable pods, far above the ~1 s the
#: wake-up takes (bench/sched_wakeup.py), so a loaded machine does not fail the test.
BOUND_WITHIN_S = 20.0
FILTERS = 'elasticgpu_scheduler_request_duration_seconds_count{verb="filter"}'


class Setup:
    def __init__(self, extender: ExtenderProcess, scheduler_name: str, client: Any,
                 namespace: str) -> None:
        self.extender = extender
        self.scheduler_name = scheduler_name
        self.client = client
        self.namespace = namespace

    def metric(self, sample: str) -> float:
        return metric_value(metrics_text(self.extender.url), sample) or 0.0

    def wait_metric(self, sample: str, ok: Callable[[float], bool], timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.metric(sample)
            if ok(value):
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sample} = {value} after {timeout_s} s")
            time.sleep(0.05)

    def wait_known(self, node: str, cards: int) -> None:
        self.wait_metric("elasticgpu_scheduler_card_compute_allocated_millicards"
                         f'{{device_index="{cards - 1}",node="{node}"}}', lambda v: v == 0, 30)

    def pod(self, name: str, **resources: str) -> dict[str, Any]:
        return pod_manifest(name, self.namespace, containers={"main": dict(resources)},
                            scheduler_name=self.scheduler_name)

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in list_pods(self.client, self.namespace)}

    def wait_bound(self, names: list[str], timeout_s: float = BOUND_WITHIN_S) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while True:
            nodes = {n: (p.get("spec") or {}).get("nodeName") for n, p in self.pods().items()}
            if all(nodes.get(n) for n in names):
                return {n: str(nodes[n]) for n in names}
            if time.monotonic() > deadline:
                raise TimeoutError(f"not bound after {timeout_s} s: "
                                   f"{[n for n in names if not nodes.get(n)]}")
            time.sleep(0.1)

    def wait_turned_away(self, names: list[str], timeout_s: float = 30.0) -> None:
        """Until kube-scheduler has marked each pod unschedulable (the extender said no)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pods = self.pods()
            if all(any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                       for c in (pods.get(n, {}).get("status") or {}).get("conditions") or [])
                   for n in names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{names} not marked unschedulable after {timeout_s} s")
            time.sleep(0.1)

    def delete(self, name: str) -> None:
        from lightkube.resources.core_v1 import Pod

        self.client.delete(Pod, name, namespace=self.namespace, grace_period=0)


def _setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
           namespace: str, filter_result: str) -> Iterator[Setup]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    client = k8s_cluster.client()
    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log",
                               # binpack, as these tests were written for (the default
                               # was binpack until issue 19 made it fgdx-auto)
                               config={"filterResult": filter_result, "nodePolicy": "binpack"})
    extender.start()
    name = extender.scheduler_name
    start_kube_scheduler(extender_kube_scheduler_config(extender.url, name,
                                                        prioritize=filter_result == "all"))
    try:
        yield Setup(extender, name, client, namespace)
    finally:
        extender.stop()


@pytest.fixture
def setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
          k8s_namespace: str) -> Iterator[Setup]:
    yield from _setup(k8s_cluster, start_kube_scheduler, tmp_path, k8s_namespace, "all")


@pytest.fixture
def best_setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
               k8s_namespace: str) -> Iterator[Setup]:
    yield from _setup(k8s_cluster, start_kube_scheduler, tmp_path, k8s_namespace, "best")


def test_pods_turned_away_before_the_extender_saw_a_deletion_are_woken_one_per_card(
        setup: Setup, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    (node,) = fake_gpu_nodes(1, gpus=1)
    setup.wait_known(node, 1)
    create_pods(setup.client, [setup.pod("holder", **{"elasticgpu.io/gpu-core": "100"})])
    setup.wait_bound(["holder"])
    waiting = [f"waiting-{i}" for i in range(3)]
    create_pods(setup.client, [setup.pod(n, **{"elasticgpu.io/gpu-core": "100"})
                               for n in waiting])
    setup.wait_turned_away(waiting)

    with paused(api_worker_pid(setup.extender)):
        filters = setup.metric(FILTERS)
        setup.delete("holder")
        # kube-scheduler saw the deletion and retried each pod; the extender, whose view is
        # behind, turned them away again
        setup.wait_metric(FILTERS, lambda v: v >= filters + len(waiting), 10)
        time.sleep(0.5)
        assert all(not (p.get("spec") or {}).get("nodeName") for p in setup.pods().values())

    bound = _wait_any_bound(setup, waiting)
    # one card freed: one pod woken (the others would not fit), and no second round for it
    time.sleep(2)
    still = [n for n, p in setup.pods().items() if not (p.get("spec") or {}).get("nodeName")]
    assert sorted(still) == sorted(set(waiting) - {bound})
    assert setup.metric('elasticgpu_scheduler_wakeups_total{result="sent"}') == 1
    assert setup.metric("elasticgpu_scheduler_waiting_pods") == 2

    # the next freeing wakes the next one
    setup.delete(bound)
    _wait_any_bound(setup, still)


def _wait_no_pod_deletions(client: Any, timeout_s: float = 60.0) -> None:
    """Until no pod in the cluster is being deleted or in a terminating namespace (the test
    fixtures delete their namespaces without waiting)."""
    from lightkube.resources.core_v1 import Namespace, Pod

    deadline = time.monotonic() + timeout_s
    while True:
        # a terminating namespace's pods will be deleted; one stuck on another kind's
        # finalizer, its pods gone, is no event to wait for
        terminating = {n.metadata.name for n in client.list(Namespace)
                       if n.status and n.status.phase == "Terminating"}
        busy = [f"{p.metadata.namespace}/{p.metadata.name}"
                for p in client.list(Pod, namespace="*")
                if p.metadata.deletionTimestamp or p.metadata.namespace in terminating]
        if not busy:
            return
        if time.monotonic() > deadline:
            # stuck on a finalizer, say: go on; a retry it causes fails the test's own checks
            warnings.warn(f"still being deleted after {timeout_s} s: {busy[:5]}", stacklevel=2)
            return
        time.sleep(0.2)


def _wait_any_bound(setup: Setup, names: list[str]) -> str:
    deadline = time.monotonic() + BOUND_WITHIN_S
    while time.monotonic() < deadline:
        pods = setup.pods()
        for name in names:
            if (pods.get(name, {}).get("spec") or {}).get("nodeName"):
                return name
        time.sleep(0.1)
    raise TimeoutError(f"none of {names} bound after {BOUND_WITHIN_S} s")


def test_a_card_turning_healthy_wakes_the_pod_that_fits_it(
        setup: Setup, k8s_cluster: Any) -> None:
    """Only the GPUDevice changes: kube-scheduler sees no event at all."""
    from lightkube.types import PatchType

    from egpu_testing.gpudevice_kind import GPUDevice
    from elastic_gpu.api.gpudevice import object_name

    node = unique_name("sick")
    sick = Node(node, 96_000, 786_432, (Card(0, f"GPU-{node}-0", "A100-SXM4-80GB", 81920,
                                             health=Health.UNHEALTHY),))
    register_fake_nodes(k8s_cluster.kube(), [sick])
    try:
        setup.wait_known(node, 1)
        # An earlier test's pods still being deleted would be events kube-scheduler retries
        # the pod on, so it could bind without being woken: wait until there are none.
        _wait_no_pod_deletions(setup.client)
        create_pods(setup.client, [setup.pod("waiting", **{"elasticgpu.io/gpu-core": "50"})])
        setup.wait_turned_away(["waiting"])
        setup.client.patch(GPUDevice.Status, object_name(node, 0),
                           {"status": {"health": "Healthy"}}, patch_type=PatchType.MERGE)
        assert setup.wait_bound(["waiting"]) == {"waiting": node}
        # the wake-up is counted when the API worker's answer reaches the scheduler process,
        # which a loaded machine can deliver after kube-scheduler has bound the pod
        sent = 'elasticgpu_scheduler_wakeups_total{result="sent"}'
        assert setup.wait_metric(sent, lambda v: v >= 1, 10) == 1
        conditions = {c["type"]: c for c in setup.pods()["waiting"]["status"]["conditions"]}
        assert conditions["elasticgpu.io/GPUCapacityFreed"]["status"] == "True"
    finally:
        unregister_fake_node(k8s_cluster.kube(), node)


def test_a_node_whose_gpudevices_arrive_after_it_wakes_the_pod_that_fits(
        setup: Setup, k8s_cluster: Any) -> None:
    """The Node joins first (kube-scheduler retries the pod on it; the extender does not know
    its cards yet and turns the pod away), its GPUDevices come later: no kube-scheduler event."""
    from lightkube import codecs

    from elastic_gpu.agent.deviceplugin.inventory_api import publish_inventory
    from elastic_gpu.devcluster.nodes import fake_inventory, node_manifest
    from elastic_gpu.kube.sync import SyncKubeClient

    create_pods(setup.client, [setup.pod("waiting", **{"elasticgpu.io/gpu-core": "50"})])
    setup.wait_turned_away(["waiting"])
    node = unique_name("late")
    inventory = fake_inventory(node, gpus=1)
    setup.client.create(codecs.from_dict(node_manifest(inventory)))
    try:
        filters = setup.metric(FILTERS)
        setup.wait_metric(FILTERS, lambda v: v > filters, 10)  # retried on the new Node
        time.sleep(0.5)
        assert not (setup.pods()["waiting"].get("spec") or {}).get("nodeName")
        with SyncKubeClient.from_config(k8s_cluster.kubeconfig) as agent_client:
            publish_inventory(agent_client, inventory)
        assert setup.wait_bound(["waiting"]) == {"waiting": node}
    finally:
        unregister_fake_node(k8s_cluster.kube(), node)


def test_a_bind_in_flight_holds_its_cpu_so_the_next_pod_is_placed_right(
        best_setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_cluster: Any) -> None:
    """binpack, filterResult best (kube-scheduler binds the engine's one node). n1 has two
    cards, n2 one card and a pod holding 2 CPUs. The hog takes a card and 94 of n1's 96 CPUs;
    while its Binding is in flight (API worker paused) a small share arrives. With the hold,
    n1 has the least CPU left and gets it; without it (the HTTP path zeroed the pod's CPU before
    `reserve` saw it) n1 looks emptier than n2 and the share went to n2."""
    setup = best_setup
    (n1,) = fake_gpu_nodes(1, gpus=2)
    (n2,) = fake_gpu_nodes(1, gpus=1)
    setup.wait_known(n1, 2)
    setup.wait_known(n2, 1)
    web = pod_manifest("web", setup.namespace, containers={"main": {"cpu": "2"}})
    web["spec"]["nodeName"] = n2
    create_pods(setup.client, [web])
    setup.wait_metric(f'elasticgpu_scheduler_node_requested_cpu_cores{{node="{n2}"}}',
                      lambda v: v == 2.0, 30)

    hog = setup.pod("hog", **{"elasticgpu.io/gpu-core": "100", "cpu": "94", "memory": "100Gi"})
    hog["spec"]["nodeSelector"] = {"kubernetes.io/hostname": n1}
    with paused(api_worker_pid(setup.extender)):
        create_pods(setup.client, [hog])
        # the hold, seen while the Binding cannot land (kube-scheduler gives up after 5 s)
        setup.wait_metric(f'elasticgpu_scheduler_node_requested_cpu_cores{{node="{n1}"}}',
                          lambda v: v == 94.0, 2.5)
        filters = setup.metric(FILTERS)
        create_pods(setup.client, [setup.pod("small", **{"elasticgpu.io/gpu-core": "10",
                                                         "cpu": "1"})])
        setup.wait_metric(FILTERS, lambda v: v > filters, 2)
        time.sleep(0.3)  # its bind reaches the extender too
    assert setup.wait_bound(["hog", "small"]) == {"hog": n1, "small": n1}
    assert setup.metric(f'elasticgpu_scheduler_node_requested_cpu_cores{{node="{n1}"}}') == 95.0
