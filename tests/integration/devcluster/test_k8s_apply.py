"""`k8s.apply.create_or_update`, the sandbox's installer of tenant roles and admission
policies, against the real apiserver: created once, brought up to date the second time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from elastic_gpu.kube.apply import create_or_update

pytestmark = pytest.mark.integration


def role(name: str, verbs: list[str]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "elastic-gpu"}},
            "rules": [{"apiGroups": ["elasticgpu.io"], "resources": ["elasticgpuclaims"],
                       "verbs": verbs}]}


def test_created_then_brought_up_to_date(k8s_cluster: Any) -> None:
    name = unique_name("egpu-apply")
    client = k8s_cluster.kube()
    try:
        create_or_update(client, [role(name, ["get", "list"])])
        create_or_update(client, [role(name, ["get"])])  # exists: the rules are replaced
        got = json.loads(k8s_cluster.kubectl("get", "clusterrole", name, "-o", "json").stdout)
        assert got["rules"][0]["verbs"] == ["get"]
        assert got["metadata"]["labels"]["app.kubernetes.io/part-of"] == "elastic-gpu"
    finally:
        k8s_cluster.kubectl("delete", "clusterrole", name, "--ignore-not-found")
