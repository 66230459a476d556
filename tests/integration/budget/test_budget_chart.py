"""The chart's budget and quota settings (values `budgets.*`), rendered by helm: the
PriorityClass the code names, the webhook's and the controller's flags as the values say."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.k8s.budget import priority_class_manifest

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[3] / "charts" / "elastic-gpu"


def render(tmp_path: Path, **values: Any) -> list[dict[str, Any]]:
    binary = find_bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"no helm in {binary.parent}: run hack/ensure-k8s.sh")
    args = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HELM_CACHE_HOME": str(tmp_path / "c"),
           "HELM_CONFIG_HOME": str(tmp_path / "f"), "HELM_DATA_HOME": str(tmp_path / "d")}
    out = subprocess.run([str(binary), "template", "egpu", str(CHART), "-n", "elastic-gpu",
                          *args], capture_output=True, text=True, timeout=120, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def command(objs: list[dict[str, Any]], name: str) -> list[str]:
    for obj in objs:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == name:
            return list(obj["spec"]["template"]["spec"]["containers"][0]["command"])
    return []


def test_defaults_create_the_class_and_hold_pods_with_the_finalizer(tmp_path: Path) -> None:
    objs = render(tmp_path)
    (cls,) = [o for o in objs if o["kind"] == "PriorityClass"]
    want = priority_class_manifest()
    assert (cls["metadata"]["name"], cls["value"], cls["preemptionPolicy"]) == (
        want["metadata"]["name"], want["value"], want["preemptionPolicy"])
    webhook = command(objs, "elastic-gpu-webhook")
    assert "--over-budget-priority-class=egpu-over-budget" in webhook
    assert "--budget-finalizer" in webhook and "--quota-resources" in webhook
    assert not any(a.startswith("--budget-default") for a in command(objs,
                                                                    "elastic-gpu-controller"))


def test_values_turn_quota_off_the_default_budget_on_and_the_finalizer_off(tmp_path: Path
                                                                           ) -> None:
    objs = render(tmp_path, **{"budgets.quotaResources": False, "budgets.defaultGPUHours": 2.5,
                               "budgets.defaultPeriod": "24h"})
    assert "--quota-resources" not in command(objs, "elastic-gpu-webhook")
    controller = command(objs, "elastic-gpu-controller")
    assert "--budget-default-gpu-hours=2.5" in controller
    assert "--budget-default-period=24h" in controller
    # no controller: no finalizer (nothing would remove it); the class can be left to others
    objs = render(tmp_path, **{"controller.enabled": False,
                               "budgets.overBudgetPriorityClass.create": False})
    assert "--budget-finalizer" not in command(objs, "elastic-gpu-webhook")
    assert not [o for o in objs if o["kind"] == "PriorityClass"]
