"""Issue #17, must-show 1, on the real control plane with `egpu webhook` and the budget keeper
(`egpu controller`): a namespace with a small budget (18 GPU-seconds per 60 s period, the
shortest allowed). Its first GPU pod keeps the default priority; once that pod has spent the
budget the GPUBudget turns OverBudget and the next GPU pod gets the lower PriorityClass (class, value and
preemptionPolicy, as the apiserver stores it); at the period's end the budget refills and a
new pod has the default priority again. kwok runs the pods (real `startedAt`)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.binding import BY_HAND, binding
from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from egpu_testing.webhook import running_webhook
from elastic_gpu.api.budget import OVER_BUDGET_CLASS, OVER_BUDGET_VALUE
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

LABEL = "egpu-budget-priority"
PERIOD_S = 60  # core.budget.allowance.MIN_PERIOD_S: the shortest period a GPUBudget may have


def _pod(name: str, ns: str) -> dict[str, Any]:
    """A GPU pod for the test to bind to its node (`egpu_testing.binding`)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": BY_HAND, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "cuda", "resources": {
                         "limits": {"tencent.com/vcuda-core": "100"}}}]}}


def test_small_budget_default_priority_until_spent_then_lower_then_refilled(
        k8s_cluster: Any, k8s_namespace: str, fake_gpu_nodes: Callable[..., list[str]],
        tmp_path: Path) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds, install_priority_classes

    install_elasticgpu_crds(k8s_cluster.kube())
    install_priority_classes(k8s_cluster.kube())  # what the sandbox and the chart create
    (node,) = fake_gpu_nodes(1, gpus=8)
    ns = k8s_namespace
    (port,) = free_ports(1)
    keeper = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                               extender_url="http://127.0.0.1:1", identity=unique_name("keeper"),
                               lease_name=unique_name("budget-prio"), lease=(4, 3, 0.5),
                               extra=["--only", "budgets", "--budget-refresh-seconds", "2"])
    with running_webhook(k8s_cluster, tmp_path, "budget-prio", LABEL,
                         extra_args=["--budget-finalizer"]) as hook:
        k8s_cluster.kubectl("label", "namespace", ns, f"{LABEL}={hook.name}")
        start = int(time.time()) - 1
        k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
            "metadata": {"name": "small", "namespace": ns},
            "spec": {"gpuHours": 0.005, "period": f"{PERIOD_S}s",  # 18 GPU-seconds
                     "periodStart": dt.datetime.fromtimestamp(start, dt.UTC).strftime(
                         "%Y-%m-%dT%H:%M:%SZ")}}))
        keeper.start()
        try:
            def budget() -> dict[str, Any]:
                obj: dict[str, Any] = json.loads(k8s_cluster.kubectl(
                    "get", "gpubudget", "small", "-n", ns, "-o", "json").stdout)
                return obj

            def over() -> str | None:
                for c in (budget().get("status") or {}).get("conditions") or []:
                    if c["type"] == "OverBudget":
                        return str(c["status"])
                return None

            def admitted(name: str, dry_run: bool = False) -> dict[str, Any]:
                args = ["create", "-o", "json", "-f", "-"]
                if dry_run:
                    args.insert(1, "--dry-run=server")
                out: dict[str, Any] = json.loads(k8s_cluster.kubectl(
                    *args, input=json.dumps(_pod(name, ns))).stdout)
                if not dry_run:
                    k8s_cluster.kubectl("create", "-f", "-",
                                        input=json.dumps(binding(name, ns, node)))
                return out

            wait_for("the keeper's first status", lambda: over() == "False", 30)
            first = admitted("first")
            assert "priorityClassName" not in first["spec"]
            assert first["spec"].get("priority", 0) == 0
            assert "elasticgpu.io/budget" in first["metadata"]["finalizers"]

            # one card running: 18 GPU-seconds are spent ~18 s after it starts
            wait_for("OverBudget=True", lambda: over() == "True", PERIOD_S - 5)
            spent_at = time.time()
            assert budget()["status"]["used"] >= 0.005
            assert spent_at < start + PERIOD_S, "the budget must run out within the period"
            wait_for("the webhook seeing OverBudget", lambda: admitted(
                "probe", dry_run=True)["spec"].get("priorityClassName") == OVER_BUDGET_CLASS, 10)
            second = admitted("second")
            assert second["spec"]["priorityClassName"] == OVER_BUDGET_CLASS
            assert second["spec"]["priority"] == OVER_BUDGET_VALUE
            assert second["spec"]["preemptionPolicy"] == "Never"
            printed = k8s_cluster.kubectl("get", "gpubudgets", "-n", ns).stdout
            print(printed)
            assert "True" in printed.splitlines()[1]

            # both pods go before the period ends: the next period starts empty
            for name in ("first", "second"):
                k8s_cluster.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0",
                                    "--force", "--wait=false")
            wait_for("OverBudget=False after the refill", lambda: over() == "False",
                     start + 2 * PERIOD_S - time.time())
            refilled = budget()["status"]
            assert time.time() >= start + PERIOD_S - 1, "refilled only at the period's end"
            assert refilled["used"] == 0 and refilled["remaining"] == 0.005
            wait_for("the webhook seeing the refill", lambda: "priorityClassName" not in admitted(
                "probe", dry_run=True)["spec"], 10)
            third = admitted("third")
            assert "priorityClassName" not in third["spec"]
            assert third["spec"].get("priority", 0) == 0
        finally:
            keeper.stop()
