"""The chart's wiring for tenants (issue #26, items 14 and 15), rendered by helm: the quota's
canonical names on by default with the names kube-scheduler must ignore, and the tenant
ClusterRoles exactly as `k8s.tenant_rbac` (which the sandbox applies) says, each with a value
that turns it off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.chart import helm_template
from elastic_gpu.api.tenant_rbac import manifests
from elastic_gpu.core.quota import QUOTA_NAMES

pytestmark = pytest.mark.integration



def webhook_command(objs: list[dict[str, Any]]) -> list[str]:
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"
                 and o["metadata"]["name"] == "elastic-gpu-webhook"]
    return list(deploy["spec"]["template"]["spec"]["containers"][0]["command"])


def rbac(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs
            if o["kind"] in ("ClusterRole", "ClusterRoleBinding")}


def test_quota_names_are_on_by_default_and_ignored_by_the_charts_kube_scheduler(
        tmp_path: Path) -> None:
    objs = helm_template(tmp_path)
    assert "--quota-resources" in webhook_command(objs)
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"
                 and "kube-scheduler" in o["metadata"]["name"]]
    scheduler = yaml.safe_load(next(iter(config["data"].values())))
    managed = {m["name"]: m["ignoredByScheduler"]
               for ext in scheduler["extenders"] for m in ext["managedResources"]}
    assert all(managed.get(name) is True for name in QUOTA_NAMES), managed
    assert "--quota-resources" not in webhook_command(
        helm_template(tmp_path, **{"budgets.quotaResources": False}))


def test_tenant_roles_are_the_sandboxs_and_values_turn_them_off(tmp_path: Path) -> None:
    rendered = rbac(helm_template(tmp_path))
    for want in manifests():
        key = (want["kind"], want["metadata"]["name"])
        assert key in rendered, key
        got = rendered[key]
        assert got["metadata"]["labels"].items() >= want["metadata"]["labels"].items()
        for field in ("rules", "roleRef", "subjects"):
            assert got.get(field) == want.get(field), (key, field)

    roles = set(rbac(helm_template(tmp_path, **{"tenants.aggregateToDefaultRoles": False})))
    assert ("ClusterRole", "elastic-gpu-tenant-edit") not in roles
    assert ("ClusterRole", "elastic-gpu-tenant-view") not in roles
    assert ("ClusterRoleBinding", "elastic-gpu-inventory-reader") in roles
    roles = set(rbac(helm_template(tmp_path, **{"tenants.inventoryReaders": []})))
    assert ("ClusterRoleBinding", "elastic-gpu-inventory-reader") not in roles
    assert ("ClusterRole", "elastic-gpu-tenant-edit") in roles
