"""Issue #26 item 7 on the real control plane: a GPUBudget's period has a floor (1m), refused
at create below it with the field and the rule, and the budget keeper (`egpu controller --only
budgets`) writes a status only when it changes: a budget with no pods keeps its
resourceVersion over several keeper cycles and across a keeper restart.

The cycles are driven, not waited for: each touch of the object (a label) is an event the
keeper reconciles; `elasticgpu_controller_reconciles_total{controller="budgets"}` going up says
it has, and then the object must still be at the touch's resourceVersion.

What failed before the fix: the 1s period was accepted (and rewrote the status every second,
its period changing every second). A restarted keeper PUT an unchanged status; kube-apiserver
stores nothing for an identical object, so the resourceVersion held even then, and the test
sees that PUT is skipped now through `elasticgpu_budget_status_writes_total{result=
"unchanged"}`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.api import budget as api
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

CYCLES = 3


def _budget(name: str, ns: str, period: str) -> str:
    return json.dumps({"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"gpuHours": 1, "period": period}})


def _reconciles(keeper: ControllerProcess) -> float:
    total = 0.0
    for line in keeper.metrics().splitlines():
        if line.startswith("elasticgpu_controller_reconciles_total{") and \
                'controller="budgets"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _unchanged(keeper: ControllerProcess) -> float:
    found = re.search(r'^elasticgpu_budget_status_writes_total\{result="unchanged"\} (\S+)$',
                      keeper.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("period", ["1s", "30s", "59s"])
def test_a_period_below_the_floor_is_refused_at_create(k8s_cluster: Any, k8s_namespace: str,
                                                        period: str) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    result = k8s_cluster.kubectl("create", "-f", "-",
                                 input=_budget("fast", k8s_namespace, period), check=False)
    assert result.returncode != 0, f"period {period} was accepted: {result.stdout}"
    for words in ("spec.period", "at least 1m", "rewrites the status once a period"):
        assert words in result.stderr, result.stderr
    # the floor itself is accepted
    k8s_cluster.kubectl("create", "-f", "-", input=_budget("floor", k8s_namespace, "1m"))


def test_a_budget_without_pods_is_not_rewritten(k8s_cluster: Any, k8s_namespace: str,
                                                tmp_path: Path) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    # a long period: its end (a real change, written) cannot fall inside the test
    k8s_cluster.kubectl("create", "-f", "-", input=_budget("idle", k8s_namespace, "24h"))

    def stored() -> dict[str, Any]:
        out = k8s_cluster.kubectl("get", "gpubudget", "idle", "-n", k8s_namespace, "-o", "json",
                                  "--show-managed-fields")
        return dict(json.loads(out.stdout))

    (port,) = free_ports(1)
    keeper = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                               extender_url="http://127.0.0.1:1", identity=unique_name("keeper"),
                               lease_name=unique_name("budget-writes"), lease=(4, 3, 0.5),
                               extra=["--only", "budgets", "--budget-refresh-seconds", "1",
                                      "--budget-min-write-seconds", "0"])
    try:
        keeper.start()
        wait_for("the keeper leading", keeper.leading, 120)
        first = wait_for("the keeper's first status", lambda: stored() if (
            stored().get("status") or {}).get("periodStart") else None, 120)
        status = first["status"]
        for cycle in range(CYCLES + 1):
            if cycle == CYCLES:  # a restarted keeper has no memory of its writes
                keeper.stop()
                keeper.start()
                wait_for("the restarted keeper leading", keeper.leading, 120)
                before = 0.0
            else:
                before = _reconciles(keeper)
            # (a patch prints the object the server wrote: its resourceVersion is the touch's)
            rv = k8s_cluster.kubectl(
                "patch", "gpubudget", "idle", "-n", k8s_namespace, "--type=merge", "-p",
                json.dumps({"metadata": {"labels": {"cycle": str(cycle)}}}),
                "-o", "jsonpath={.metadata.resourceVersion}").stdout.strip()
            wait_for(f"cycle {cycle}: the keeper reconciling the touched budget",
                     lambda b=before: _reconciles(keeper) > b, 120)
            now = stored()
            assert now["metadata"]["resourceVersion"] == rv, (
                f"cycle {cycle}: the keeper rewrote a budget with no pods and nothing new "
                f"(status before {status}, after {now.get('status')}); writes: "
                f"{[m for m in keeper.metrics().splitlines() if 'status_writes' in m]}; "
                f"managedFields: {now['metadata'].get('managedFields')}; log:\n"
                f"{keeper.log_tail()}")
            assert now["status"] == status
        # the restarted keeper found the status as it would write it, and wrote nothing
        assert _unchanged(keeper) >= 1, keeper.metrics()
    finally:
        keeper.stop()
