"""kube-controller-manager in the dev cluster: what a user expects of a cluster happens.

Deployments make ReplicaSets make pods, scaling follows, deleting a Deployment deletes its
pods (garbage collector), Jobs make pods, ResourceQuota status is computed and enforced,
a deleted namespace goes away with what was in it, and pods get their ServiceAccount token
volume (the ServiceAccount admission plugin is on) and still run on kwok nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import Deployment, ReplicaSet
from lightkube.resources.core_v1 import Namespace, Pod, ResourceQuota

from egpu_testing.pytest_plugin import (
    delete_namespace,
    unique_name,
    wait_default_service_account,
)
from elastic_gpu.devcluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration


def _wait(predicate: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _deployment(name: str, namespace: str, node: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "c", "image": "busybox"}]}}},
    }


def _pods(client: Any, namespace: str, app: str) -> list[Any]:
    return [p for p in client.list(Pod, namespace=namespace, labels={"app": app})
            if p.metadata.deletionTimestamp is None]


def test_deployment_pods_come_from_its_replicaset_scale_and_are_garbage_collected(
        k8s_cluster: ControlPlane, k8s_namespace: str,
        fake_gpu_nodes: Callable[..., list[str]]) -> None:
    (node,) = fake_gpu_nodes(1, gpus=1)
    client = k8s_cluster.client()
    ns = k8s_namespace
    client.create(codecs.from_dict(_deployment("web", ns, node, replicas=2)))

    pods = _wait(lambda: len(_pods(client, ns, "web")) == 2 and _pods(client, ns, "web"),
                 what="the Deployment's 2 pods")
    (rs,) = client.list(ReplicaSet, namespace=ns)
    deployment = client.get(Deployment, "web", namespace=ns)
    # Deployment -> ReplicaSet -> pods, each owned (controller ref) by the one above.
    assert [(o.kind, o.uid, o.controller) for o in rs.metadata.ownerReferences] == [
        ("Deployment", deployment.metadata.uid, True)]
    for pod in pods:
        assert [(o.kind, o.uid) for o in pod.metadata.ownerReferences] == [
            ("ReplicaSet", rs.metadata.uid)]
        # ServiceAccount admission is on: the pod runs as `default` with its token volume.
        assert pod.spec.serviceAccountName == "default"
        assert any(v.name.startswith("kube-api-access-") and v.projected is not None
                   for v in pod.spec.volumes)

    # ... and still runs on a kwok node; the Deployment sees its replicas available.
    _wait(lambda: all(p.status.phase == "Running" for p in _pods(client, ns, "web")),
          what="the pods Running on the kwok node")
    _wait(lambda: (client.get(Deployment, "web", namespace=ns).status.availableReplicas
                   or 0) == 2, what="2 available replicas in the Deployment's status")

    k8s_cluster.kubectl("scale", "deployment/web", "--replicas=3", "-n", ns)
    _wait(lambda: len(_pods(client, ns, "web")) == 3, what="a third pod after scaling")

    k8s_cluster.kubectl("delete", "deployment", "web", "-n", ns, "--wait=false")
    # The garbage collector deletes the ReplicaSet (owned by the Deployment), then its pods;
    # kwok finishes each pod's graceful deletion.
    _wait(lambda: not list(client.list(Pod, namespace=ns, labels={"app": "web"}))
          and not list(client.list(ReplicaSet, namespace=ns)),
          what="the ReplicaSet and all pods garbage-collected")


def test_a_job_makes_its_pod(k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    ns = k8s_namespace
    k8s_cluster.kubectl("create", "job", "once", "--image=busybox", "-n", ns)
    client = k8s_cluster.client()
    pods = _wait(lambda: list(client.list(Pod, namespace=ns,
                                          labels={"job-name": "once"})),
                 what="the Job's pod")
    assert [o.kind for o in pods[0].metadata.ownerReferences] == ["Job"]


def _quota_used(client: Any, ns: str) -> dict[str, str]:
    status = client.get(ResourceQuota, "q", namespace=ns).status
    return dict(status.used or {}) if status is not None else {}


def _pod(name: str, ns: str, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": "nobody",  # stays Pending: only the quota matters
                     "containers": [{"name": "c", "image": "busybox", "resources": {
                         "requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]}}


def test_resource_quota_status_is_computed_and_enforced(
        k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    client = k8s_cluster.client()
    ns = k8s_namespace
    client.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": ns},
        "spec": {"hard": {"pods": "2", "requests.cpu": "1"}}}))
    # The resourcequota controller fills in status (hard and used) for a fresh quota.
    _wait(lambda: _quota_used(client, ns) == {"pods": "0", "requests.cpu": "0"},
          what="the quota's status computed")
    quota = client.get(ResourceQuota, "q", namespace=ns)
    assert dict(quota.status.hard) == {"pods": "2", "requests.cpu": "1"}

    client.create(codecs.from_dict(_pod("a", ns, "600m")))
    _wait(lambda: _quota_used(client, ns) == {"pods": "1", "requests.cpu": "600m"},
          what="the quota's usage after one pod")

    with pytest.raises(ApiError) as refused:  # 600m + 600m > 1 CPU
        client.create(codecs.from_dict(_pod("b", ns, "600m")))
    assert refused.value.status.code == 403
    assert "exceeded quota: q" in refused.value.status.message
    assert "requests.cpu" in refused.value.status.message

    client.create(codecs.from_dict(_pod("c", ns, "400m")))  # exactly fills it
    with pytest.raises(ApiError) as refused:
        client.create(codecs.from_dict(_pod("d", ns, "0")))
    assert refused.value.status.code == 403
    assert "pods" in refused.value.status.message

    # Deleting a pod gives its share back (the controller recomputes usage).
    k8s_cluster.kubectl("delete", "pod", "a", "-n", ns, "--wait=false")
    _wait(lambda: _quota_used(client, ns) == {"pods": "1", "requests.cpu": "400m"},
          what="usage to drop after a pod is deleted")


def test_a_deleted_namespace_goes_away_with_its_contents(
        k8s_cluster: ControlPlane, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    """As the `k8s_namespace` fixture deletes each test's namespace after the test."""
    (node,) = fake_gpu_nodes(1, gpus=1)
    client = k8s_cluster.client()
    ns = unique_name("gone")
    k8s_cluster.kubectl("create", "namespace", ns)
    wait_default_service_account(k8s_cluster, ns)
    client.create(codecs.from_dict(_deployment("web", ns, node, replicas=1)))
    _wait(lambda: any(p.status.phase == "Running" for p in _pods(client, ns, "web")),
          what="a running pod in the namespace")

    delete_namespace(k8s_cluster, ns)

    def gone() -> bool:
        try:
            client.get(Namespace, ns)
        except ApiError as err:
            return err.status.code == 404
        return False

    _wait(gone, timeout_s=90, what="the namespace to be deleted")
    assert not list(client.list(Pod, namespace=ns))
