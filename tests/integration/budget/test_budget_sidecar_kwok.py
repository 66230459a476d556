"""A sidecar's GPU time is billed on a kwok node as on a real one: kwok reports the pod's init
containers in `initContainerStatuses` (a sidecar, `restartPolicy: Always`, running since the
pod started), as kubelet does, and the budget keeper (a process, on the real kube-apiserver)
counts the sidecar's share from that status.

Without the statuses the sidecar has no run the keeper can see: its GPU time is never billed
and the budget's `used` stays 0."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.sidecars import with_init_container
from egpu_testing.waiting import wait_for
from elastic_gpu.devcluster.kwok import FAKE_NODE_ANNOTATION, FAKE_NODE_ANNOTATION_VALUE
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

#: half a card (tencent.com/vcuda-core counts percent of one card)
HALF_CARD = {"tencent.com/vcuda-core": "50"}
#: generous: the box may be loaded; a deadline that expires is a failure of behaviour
DEADLINE_S = 120.0


def _create(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(obj))


def _get(cluster: Any, kind: str, name: str, ns: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def test_a_sidecars_gpu_time_on_a_kwok_node_is_billed(k8s_cluster: Any, k8s_namespace: str,
                                                     tmp_path: Path) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    ns, node = k8s_namespace, unique_name("kwok-sidecar")
    _create(k8s_cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "annotations": {FAKE_NODE_ANNOTATION: FAKE_NODE_ANNOTATION_VALUE}}})
    _create(k8s_cluster, {"apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
                          "metadata": {"name": "team", "namespace": ns},
                          "spec": {"gpuHours": 10, "period": "24h"}})
    # the GPU is the sidecar's only (the main container asks none), placed by name: kwok runs it
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "served", "namespace": ns},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "busybox"}]}}
    pod = with_init_container(pod, "setup", {"cpu": "100m"}, sidecar=False)
    _create(k8s_cluster, with_init_container(pod, "proxy", HALF_CARD))

    def init_statuses() -> dict[str, Any] | None:
        found = _get(k8s_cluster, "pod", "served", ns) or {}
        statuses = (found.get("status") or {}).get("initContainerStatuses") or []
        return {s["name"]: s for s in statuses} or None

    statuses = wait_for("kwok to report the pod's init containers", init_statuses, DEADLINE_S)
    assert set(statuses) == {"setup", "proxy"}
    assert statuses["proxy"]["started"] and statuses["proxy"]["state"]["running"]["startedAt"]
    assert statuses["setup"]["state"]["terminated"]["reason"] == "Completed"

    (port,) = free_ports(1)
    keeper = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                               extender_url="http://127.0.0.1:1", identity=unique_name("keeper"),
                               lease_name=unique_name("budget-sidecar"), lease=(4, 3, 0.5),
                               extra=["--only", "budgets", "--budget-refresh-seconds", "1",
                                      "--budget-min-write-seconds", "0"])

    def used_hours() -> float:
        found = _get(k8s_cluster, "gpubudget", "team", ns) or {}
        return float((found.get("status") or {}).get("used") or 0)

    started = statuses["proxy"]["state"]["running"]["startedAt"]
    try:
        keeper.start()
        wait_for("the keeper leading", keeper.leading, DEADLINE_S)
        try:
            hours = wait_for("the budget billing the sidecar's half card",
                             lambda: (u := used_hours()) > 0 and u, DEADLINE_S)
        except AssertionError:
            raise AssertionError(f"used {used_hours()} GPU-hours; sidecar started {started}; "
                                 f"keeper log:\n{keeper.log_tail()}") from None
        # half a card since the sidecar started, no more (the status rounds to 0.0001 h)
        ran_s = time.time() - datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
        assert hours <= 0.5 * (ran_s + 1) / 3600 + 0.0001, (hours, ran_s)
        # the pod goes: the keeper settles its usage and lets it go (its finalizer)
        k8s_cluster.kubectl("delete", "pod", "served", "-n", ns, "--wait=false")
        wait_for("the keeper to settle the pod and let it go",
                 lambda: _get(k8s_cluster, "pod", "served", ns) is None, DEADLINE_S)
    finally:
        keeper.stop()
        k8s_cluster.kubectl("delete", "node", node, "--wait=false", check=False)
