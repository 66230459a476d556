"""Issue 31 (DRA), quota part: a namespace's GPU-time budget counts GPU time held through this
driver's ResourceClaims, on the real kube-apiserver with the budget keeper as a process.

The claim's allocation is written as kube-scheduler writes it (the status subresource, by an
admin), and the pod's container status as a kubelet would report it, so the test does not
depend on a scheduler or a node: what it checks is that the keeper reads the claim. Without
the code it covers, a pod whose only GPU is a ResourceClaim is no GPU pod to the keeper, and the
budget's `used` stays 0."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.api import budget as api
from elastic_gpu.core.dra.devices import DRIVER
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

RAN_S = 1800  # the container started this long ago: half a card for it is 0.25 GPU-hours


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _apply(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(obj))


def test_gpu_time_held_through_a_resource_claim_is_counted(k8s_cluster: Any,
                                                           k8s_namespace: str,
                                                           tmp_path: Path) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    ns = k8s_namespace
    # a Node object no kubelet (and no kwok) serves: the pod GC deletes pods bound to nodes
    # that do not exist, and nothing here must rewrite the status the test writes
    node = unique_name("dra-node")
    _apply(k8s_cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    _apply(k8s_cluster, {"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
                         "metadata": {"name": "team", "namespace": ns},
                         "spec": {"gpuHours": 10, "period": "24h",
                                  # the period began before the container started
                                  "periodStart": _stamp(time.time() - 2 * RAN_S)}})
    _apply(k8s_cluster, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": "half-card", "namespace": ns},
                         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                             "deviceClassName": DRIVER,
                             "capacity": {"requests": {"compute": "50", "memory": "4Gi"}}}}]}}})
    _apply(k8s_cluster, {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "trainer", "namespace": ns},
                         "spec": {"nodeName": node,
                                  "resourceClaims": [{"name": "gpu",
                                                      "resourceClaimName": "half-card"}],
                                  "containers": [{"name": "main", "image": "busybox",
                                                  "resources": {"claims": [{"name": "gpu"}]}}]}})
    uid = k8s_cluster.kubectl("get", "pod", "trainer", "-n", ns,
                              "-o", "jsonpath={.metadata.uid}").stdout.strip()
    # kube-scheduler's allocation (consumable capacity: half the card's compute)
    k8s_cluster.kubectl("patch", "resourceclaim", "half-card", "-n", ns, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {
                            "allocation": {"devices": {"results": [{
                                "request": "gpu", "driver": DRIVER, "pool": node,
                                "device": "gpu-0", "shareID": "7c0a5b1e-0000-4000-8000-000000000001",
                                "consumedCapacity": {"compute": "50", "memory": "4Gi"}}]}},
                            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": uid}]}}))
    started = _stamp(time.time() - RAN_S)
    k8s_cluster.kubectl("patch", "pod", "trainer", "-n", ns, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {
                            "phase": "Running",
                            "containerStatuses": [{
                                "name": "main", "image": "busybox", "imageID": "", "ready": True,
                                "restartCount": 0,
                                "state": {"running": {"startedAt": started}}}]}}))
    (port,) = free_ports(1)
    keeper = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                               extender_url="http://127.0.0.1:1", identity=unique_name("keeper"),
                               lease_name=unique_name("budget-dra"), lease=(4, 3, 0.5),
                               extra=["--only", "budgets", "--budget-refresh-seconds", "1",
                                      "--budget-min-write-seconds", "0"])

    def used() -> float | None:
        out = k8s_cluster.kubectl("get", "gpubudget", "team", "-n", ns, "-o", "json").stdout
        value = (json.loads(out).get("status") or {}).get("used")
        return float(value) if value else None

    try:
        keeper.start()
        wait_for("the keeper leading", keeper.leading, 120)
        # half a card for RAN_S seconds and counting: at least 0.25 GPU-hours
        try:
            hours = wait_for("the budget counting the claim's half card",
                             lambda: (u := used()) is not None and u >= 0.25 and u, 120)
        except AssertionError:
            pod = k8s_cluster.kubectl("get", "pod", "trainer", "-n", ns, "-o", "json").stdout
            raise AssertionError(f"used {used()} GPU-hours; pod {pod}; keeper log:\n"
                                 f"{keeper.log_tail()}") from None
        assert hours < 0.5, (hours, keeper.log_tail())  # half a card, not a whole one
    finally:
        keeper.stop()
        k8s_cluster.kubectl("delete", "node", node, "--wait=false", check=False)
