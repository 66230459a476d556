"""The GPUBudget CRD on the real kube-apiserver (issue #17, the API part): installed by the
sandbox's installer, served, nonsense refused with the field and rule, and `kubectl get
gpubudgets -A` shows used / remaining at a glance."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from elastic_gpu.api import budget as api
from elastic_gpu.core.budget.allowance import Budget, BudgetState
from elastic_gpu.core.budget.settle import Settled

pytestmark = pytest.mark.integration


@pytest.fixture
def crds(k8s_cluster: Any) -> Any:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())  # what the sandbox runs at start
    return k8s_cluster


def _budget(name: str, ns: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
                       "metadata": {"name": name, "namespace": ns}, "spec": spec})


def test_budget_is_served_read_and_printed(crds: Any, k8s_namespace: str) -> None:
    crds.kubectl("create", "-f", "-", input=_budget("team", k8s_namespace, {
        "gpuHours": 2.5, "period": "1h", "periodStart": "2026-11-24T00:00:00Z",
        "overBudgetPriorityClassName": "egpu-over-budget"}))
    obj = json.loads(crds.kubectl("get", "gpubudget", "team", "-n", k8s_namespace,
                                  "-o", "json").stdout)
    assert api.budget_from_object(obj) == Budget(9000, 3600, 1795478400)
    # the status the keeper writes (api.budget.budget_status) is what the schema accepts
    budget = api.budget_from_object(obj)
    start = budget.anchor + 4 * 3600
    state = BudgetState(Fraction(4500), Fraction(4500), start, start + 3600, False)
    settled = Settled(start, Fraction(4500, 7), frozenset({"uid-1", "uid-2"}))
    status = api.budget_status(obj, budget, state, settled, start + 60)
    crds.kubectl("patch", "gpubudget", "team", "-n", k8s_namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps({"status": status}))
    stored = json.loads(crds.kubectl("get", "gpubudget", "team", "-n", k8s_namespace,
                                     "-o", "json").stdout)
    assert api.settled_from_status(stored, budget) == settled
    out = crds.kubectl("get", "gpubudgets", "-A").stdout
    header, *rows = out.splitlines()
    assert header.split()[:8] == ["NAMESPACE", "NAME", "BUDGET", "USED", "REMAINING", "PERIOD",
                                  "PERIODEND", "OVERBUDGET"], out
    row = next(r.split() for r in rows if r.startswith(k8s_namespace))
    assert row[1:8] == ["team", "2.5", "1.25", "1.25", "1h", "2026-11-24T05:00:00Z", "False"], out
    print(out)


@pytest.mark.parametrize(("spec", "words"), [
    ({"gpuHours": -1, "period": "1h"}, ["spec.gpuHours: Invalid value", "greater than or equal to 0"]),
    ({"gpuHours": 1}, ["spec.period: Required value"]),
    ({"period": "1h"}, ["spec.gpuHours: Required value"]),
    ({"gpuHours": 1, "period": "1d"}, ["spec.period: Invalid value", "should match"]),
    ({"gpuHours": 1, "period": "0s"}, ["spec.period", "at least 1m"]),
    ({"gpuHours": 1, "period": "1h", "halfLife": "0h"}, ["spec.halfLife", "at least 1s"]),
    ({"gpuHours": 1, "period": "1h", "overBudgetPriorityClassName": "Not_A_Name"},
     ["spec.overBudgetPriorityClassName: Invalid value"]),
    ({"gpuHours": 1, "period": "1h", "periodStart": "monday"}, ["spec.periodStart: Invalid value"]),
])
def test_nonsense_is_refused_naming_field_and_rule(crds: Any, k8s_namespace: str,
                                                   spec: dict[str, Any], words: list[str]) -> None:
    result = crds.kubectl("create", "-f", "-", input=_budget("bad", k8s_namespace, spec),
                          check=False)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr
