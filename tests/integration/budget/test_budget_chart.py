"""The chart's budget and quota settings (values `budgets.*`), rendered by helm: the
PriorityClass the code names, the webhook's flags and the controller's config as the values
say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from egpu_testing.chart import helm_template
from elastic_gpu.api.budget import priority_class_manifest
from elastic_gpu.api.config.strict_yaml import read_yaml

pytestmark = pytest.mark.integration



def command(objs: list[dict[str, Any]], name: str) -> list[str]:
    for obj in objs:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == name:
            return list(obj["spec"]["template"]["spec"]["containers"][0]["command"])
    return []


def controller_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The controller's --config as the chart renders it (its ConfigMap)."""
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"] == "elastic-gpu-controller"]
    data: dict[str, Any] = read_yaml(config["data"]["controller.yaml"])
    return data


def test_defaults_create_the_class_and_hold_pods_with_the_finalizer(tmp_path: Path) -> None:
    objs = helm_template(tmp_path)
    (cls,) = [o for o in objs if o["kind"] == "PriorityClass"]
    want = priority_class_manifest()
    assert (cls["metadata"]["name"], cls["value"], cls["preemptionPolicy"]) == (
        want["metadata"]["name"], want["value"], want["preemptionPolicy"])
    webhook = command(objs, "elastic-gpu-webhook")
    assert "--over-budget-priority-class=egpu-over-budget" in webhook
    assert "--budget-finalizer" in webhook and "--quota-resources" in webhook
    assert "budgets" not in controller_config(objs)


def test_values_turn_quota_off_the_default_budget_on_and_the_finalizer_off(tmp_path: Path
                                                                           ) -> None:
    objs = helm_template(tmp_path, **{"budgets.quotaResources": False, "budgets.defaultGPUHours": 2.5,
                               "budgets.defaultPeriod": "24h"})
    assert "--quota-resources" not in command(objs, "elastic-gpu-webhook")
    assert controller_config(objs)["budgets"] == {"defaultGPUHours": 2.5, "defaultPeriod": "24h"}
    # no controller: no finalizer (nothing would remove it); the class can be left to others
    objs = helm_template(tmp_path, **{"controller.enabled": False,
                               "budgets.overBudgetPriorityClass.create": False})
    assert "--budget-finalizer" not in command(objs, "elastic-gpu-webhook")
    assert not [o for o in objs if o["kind"] == "PriorityClass"]
