"""The shared control plane is the real thing: CRDs, watches, RBAC'd TLS, the real scheduler."""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest
from lightkube import codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from egpu_testing.pytest_plugin import unique_name
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.errors import ComponentStartError, DevClusterError

pytestmark = pytest.mark.integration


def _wait(predicate, timeout_s=30.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _crd(group: str, plural: str, kind: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "cards": {"type": "integer", "minimum": 0}}}}}},
            }],
        },
    }


def test_crd_objects_can_be_created_listed_and_watched(k8s_cluster: ControlPlane, k8s_namespace):
    client = k8s_cluster.client()
    group = f"{unique_name('test')}.elasticgpu.io"
    client.create(codecs.from_dict(_crd(group, "gpuclaims", "GpuClaim")))

    def established():
        crd = client.get(CustomResourceDefinition, f"gpuclaims.{group}")
        return any(c.type == "Established" and c.status == "True"
                   for c in (crd.status.conditions or []))

    _wait(established, what="CRD Established")
    GpuClaim = create_namespaced_resource(group, "v1", "GpuClaim", "gpuclaims")

    events: queue.Queue = queue.Queue()
    def first_list():
        # Established comes a moment before the new resource's watch cache: until then the
        # apiserver answers 429 "storage is (re)initializing", which clients must retry.
        listing = client.list(GpuClaim, namespace=k8s_namespace)
        try:
            return list(listing) == [] and listing.resourceVersion
        except ApiError as err:
            if err.status.code == 429:
                return None
            raise

    watch_from = _wait(first_list, what="the GpuClaim storage")

    def watch():
        for count, (event, obj) in enumerate(client.watch(
                GpuClaim, namespace=k8s_namespace, resource_version=watch_from,
                server_timeout=30), start=1):
            events.put((event, obj.metadata.name, (obj.spec or {}).get("cards")))
            if count == 5:
                return

    threading.Thread(target=watch, daemon=True).start()
    for i in range(3):
        client.create(GpuClaim(metadata={"name": f"claim-{i}"}, spec={"cards": i}),
                      namespace=k8s_namespace)
    client.patch(GpuClaim, "claim-1", {"spec": {"cards": 7}}, namespace=k8s_namespace,
                 patch_type=PatchType.MERGE)
    client.delete(GpuClaim, "claim-2", namespace=k8s_namespace)

    listed = sorted(o.metadata.name for o in client.list(GpuClaim, namespace=k8s_namespace))
    assert listed == ["claim-0", "claim-1"]

    seen = [events.get(timeout=15) for _ in range(5)]
    assert seen == [("ADDED", "claim-0", 0), ("ADDED", "claim-1", 1), ("ADDED", "claim-2", 2),
                    ("MODIFIED", "claim-1", 7), ("DELETED", "claim-2", 2)]

    # The schema is enforced by the real apiserver, not by us.
    with pytest.raises(ApiError) as info:
        client.create(GpuClaim(metadata={"name": "bad"}, spec={"cards": -1}),
                      namespace=k8s_namespace)
    assert info.value.status.code == 422


def _gpu_pod(name: str, gpus: int, node_label: str, scheduler: str | None = None) -> dict:
    spec: dict = {
        "nodeSelector": {"egpu-test": node_label},
        "containers": [{"name": "main", "image": "cuda:fake",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_gpu_pod_is_scheduled_onto_a_fake_node_and_runs(k8s_cluster, fake_gpu_nodes,
                                                        k8s_namespace):
    label = unique_name("l")
    (node,) = fake_gpu_nodes(1, gpus=2, labels={"egpu-test": label})
    # kubectl apply, as a user would.
    k8s_cluster.kubectl("apply", "-n", k8s_namespace, "-f", "-",
                        input=json.dumps(_gpu_pod("fits", 1, label)))
    client = k8s_cluster.client()

    def running():
        pod = client.get(Pod, "fits", namespace=k8s_namespace)
        return pod if pod.status.phase == "Running" else None

    pod = _wait(running, what="pod Running")
    assert pod.spec.nodeName == node
    assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)

    # The scheduler counts the extended resource: 2 more cards do not fit next to 1 used.
    client.create(codecs.from_dict(_gpu_pod("too-big", 2, label)), namespace=k8s_namespace)

    def unschedulable():
        pod = client.get(Pod, "too-big", namespace=k8s_namespace)
        return [c for c in (pod.status.conditions or [])
                if c.type == "PodScheduled" and c.reason == "Unschedulable"]

    (condition,) = _wait(unschedulable, what="FailedScheduling")
    assert "Insufficient nvidia.com/gpu" in condition.message
    assert client.get(Pod, "too-big", namespace=k8s_namespace).spec.nodeName is None


def test_a_test_can_run_its_own_scheduler(k8s_cluster, start_kube_scheduler, fake_gpu_nodes,
                                          k8s_namespace):
    label = unique_name("l")
    (node,) = fake_gpu_nodes(1, gpus=1, labels={"egpu-test": label})
    name = unique_name("sched")
    handle = start_kube_scheduler({"profiles": [{"schedulerName": name}]})
    assert handle.scheduler_names == (name,)
    client = k8s_cluster.client()
    client.create(codecs.from_dict(_gpu_pod("mine", 1, label, scheduler=name)),
                  namespace=k8s_namespace)
    pod = _wait(lambda: (p := client.get(Pod, "mine", namespace=k8s_namespace)).spec.nodeName
                and p, what="pod bound by the custom scheduler")
    assert pod.spec.nodeName == node

    with pytest.raises(DevClusterError, match="already served"):
        start_kube_scheduler({"profiles": [{"schedulerName": name}]})

    handle.stop()
    assert not handle.alive()
    client.create(codecs.from_dict(_gpu_pod("orphan", 1, label, scheduler=name)),
                  namespace=k8s_namespace)
    time.sleep(2)  # nobody serves that name now: the pod must stay unbound
    assert client.get(Pod, "orphan", namespace=k8s_namespace).spec.nodeName is None


def test_a_scheduler_that_dies_on_start_reports_its_log(start_kube_scheduler):
    bad = {"profiles": [{"schedulerName": unique_name("bad"),
                         "plugins": {"filter": {"enabled": [{"name": "NoSuchPlugin"}]}}}]}
    with pytest.raises(ComponentStartError) as info:
        start_kube_scheduler(bad)
    assert "exited while starting" in str(info.value)
    assert "NoSuchPlugin" in info.value.log_tail


def test_rbac_is_enforced_for_other_identities(k8s_cluster):
    # As a service account without bindings, listing nodes is forbidden: RBAC is on.
    result = k8s_cluster.kubectl("get", "nodes", "--as=system:serviceaccount:default:nobody",
                                 check=False)
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower()


def test_unregistering_a_fake_node_removes_what_gc_would(k8s_cluster, k8s_namespace):
    from lightkube.resources.core_v1 import Node

    from egpu_testing.gpudevice_kind import GPUDevice
    from elastic_gpu.api.gpudevice import NODE_LABEL
    from elastic_gpu.devcluster.nodes import (
        fake_inventory,
        register_fake_node,
        unregister_fake_node,
    )

    client = k8s_cluster.client()
    name = unique_name("gone")
    register_fake_node(k8s_cluster.kube(), fake_inventory(name, gpus=2))
    assert len(list(client.list(GPUDevice, labels={NODE_LABEL: name}))) == 2
    pod = _gpu_pod("on-it", 1, "unused")
    pod["spec"] = {**pod["spec"], "nodeName": name, "nodeSelector": {}}
    client.create(codecs.from_dict(pod), namespace=k8s_namespace)

    unregister_fake_node(k8s_cluster.kube(), name)
    assert name not in {n.metadata.name for n in client.list(Node)}
    assert list(client.list(GPUDevice, labels={NODE_LABEL: name})) == []
    assert [p.metadata.name for p in client.list(Pod, namespace=k8s_namespace)] == []


def test_registering_a_node_again_brings_it_up_to_date(k8s_cluster):
    # A re-run (the node exists) must update labels and capacity, not fail.
    from lightkube.resources.core_v1 import Node

    from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_node, unregister_fake_node

    client = k8s_cluster.client()
    name = unique_name("again")
    register_fake_node(k8s_cluster.kube(), fake_inventory(name, gpus=2))
    try:
        register_fake_node(k8s_cluster.kube(), fake_inventory(name, gpus=4))
        node = client.get(Node, name)
        assert node.status.capacity["nvidia.com/gpu"] == "4"
        assert node.status.capacity["elasticgpu.io/gpu-core"] == "400"
    finally:
        unregister_fake_node(k8s_cluster.kube(), name)
