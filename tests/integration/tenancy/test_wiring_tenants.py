"""Issue #26, items 14-16, on a default sandbox (`egpu sandbox up`) with tenants bound to `edit`:
what a user reaches without a cluster admin wiring anything.

- 14: a ResourceQuota on `requests.quota.elasticgpu.io/gpu-core`, as docs/budgets.md writes it,
  is enforced (the webhook adds the canonical names by default) and pods within it schedule
  (kube-scheduler ignores the names);
- 15: `edit` creates ElasticGPUClaims and reads GPUBudgets, `view` reads claims, every
  authenticated user reads GPUDevices and ElasticGPUClasses (aggregated ClusterRoles), and no
  tenant writes what decides who holds a card;
- 16: `elasticgpu.io/gpu: 1` schedules with a whole card in its assignment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from egpu_testing.sandbox import kubectl
from egpu_testing.tenant import Tenant
from elastic_gpu.core.annotations import ASSIGNMENT

pytestmark = pytest.mark.integration

T = TypeVar("T")
#: Generous: the box may be loaded; an expired deadline is a failure of behaviour.
DEADLINE_S = 120.0


def wait_for(what: str, probe: Callable[[], T | None], diagnose: Callable[[], str]) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {DEADLINE_S:.0f} s; {diagnose()}")
        time.sleep(0.5)


def gpu_pod(name: str, limits: dict[str, str]) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "cuda:fake",
                                 "resources": {"limits": limits}}]}})


def pod_json(tenant: Tenant, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(tenant.ok("get", "pod", name, "-o", "json"))
    return pod


def bound(tenant: Tenant, name: str) -> dict[str, Any] | None:
    """The pod once it is bound and carries its assignment."""
    pod = pod_json(tenant, name)
    annotations = pod["metadata"].get("annotations") or {}
    return pod if pod["spec"].get("nodeName") and ASSIGNMENT in annotations else None


def wait_bound(tenant: Tenant, name: str) -> dict[str, Any]:
    def diagnose() -> str:
        result = tenant.run("describe", "pod", name)
        return (result.stdout + result.stderr)[-1500:]
    return wait_for(f"pod {name} bound with its assignment", lambda: bound(tenant, name),
                    diagnose)


# --- item 14: the canonical quota, on by default ---------------------------------------------

def test_a_quota_in_canonical_units_is_enforced_and_pods_within_it_schedule(
        tenant: Callable[[], Tenant]) -> None:
    t = tenant()
    kc = t.kubeconfig
    # The cluster admin sets the quota, as docs/budgets.md writes it: one card's worth.
    kubectl(kc, "apply", "-n", t.namespace, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu"},
        "spec": {"hard": {"requests.quota.elasticgpu.io/gpu-core": "100"}}}))
    wait_for("the quota's status computed", lambda: json.loads(kubectl(
        kc, "get", "-n", t.namespace, "resourcequota", "gpu", "-o", "json")
        ).get("status", {}).get("hard"), lambda: "see kube-controller-manager's log")
    wait_for("the namespace's default ServiceAccount", lambda: "default" in kubectl(
        kc, "get", "-n", t.namespace, "serviceaccounts", "-o", "name"),
        lambda: "see kube-controller-manager's log")

    # Half a card under gpu-manager's name and half under nano-gpu's: one card in all.
    t.ok("create", "-f", "-", input=gpu_pod("vcuda", {"tencent.com/vcuda-core": "50"}))
    t.ok("create", "-f", "-", input=gpu_pod("nano", {"nano-gpu/gpu-percent": "50"}))
    refusal = t.refused("create", "-f", "-",
                        input=gpu_pod("third", {"elasticgpu.io/gpu-core": "50"}))
    assert "exceeded quota: gpu" in refusal, refusal
    assert "requests.quota.elasticgpu.io/gpu-core=50" in refusal, refusal

    for name in ("vcuda", "nano"):
        pod = wait_bound(t, name)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["quota.elasticgpu.io/gpu-core"] == "50"


# --- item 15: aggregated ClusterRoles --------------------------------------------------------

CLASS = """\
apiVersion: elasticgpu.io/v1alpha
kind: ElasticGPUClass
metadata: {name: shares}
provisioner: gpushare.provisioner.elasticgpu.io
reclaimPolicy: Delete
egpuBindingMode: Immediate
"""

CLAIM = """\
apiVersion: elasticgpu.io/v1alpha
kind: ElasticGPUClaim
metadata: {name: mine}
spec:
  egpuClassName: shares
  resources:
    requests: {gpushare.provisioner.elasticgpu.io/gpu-core: 10}
"""


def test_edit_uses_claims_and_reads_budgets_and_the_inventory_but_writes_nothing_else(
        tenant: Callable[[], Tenant]) -> None:
    t = tenant()
    kc = t.kubeconfig
    kubectl(kc, "apply", "-f", "-", input=CLASS)
    kubectl(kc, "apply", "-n", t.namespace, "-f", "-", input=json.dumps({
        "apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
        "metadata": {"name": "team"}, "spec": {"gpuHours": 10, "period": "168h"}}))
    # kube-controller-manager's aggregation controller copies the rules into edit.
    wait_for("edit may create ElasticGPUClaims", lambda: t.can_i("create", "elasticgpuclaims"),
             lambda: kubectl(kc, "get", "clusterrole", "edit", "-o", "yaml")[-2000:])

    t.ok("create", "-f", "-", input=CLAIM)
    claim = wait_for("the tenant's claim Bound", lambda: (
        (c := json.loads(t.ok("get", "elasticgpuclaim", "mine", "-o", "json")))
        .get("status", {}).get("phase") == "Bound" and c),
        lambda: t.run("describe", "elasticgpuclaim", "mine").stdout[-1500:])
    assert claim["status"]["elasticGPUName"]
    t.ok("patch", "elasticgpuclaim", "mine", "--type=merge",
         "-p", '{"metadata": {"labels": {"team": "a"}}}')
    assert "team" in t.ok("get", "gpubudgets", "-o", "name")
    assert "gpudevice" in t.ok("get", "gpudevices", "-o", "name")
    assert "shares" in t.ok("get", "elasticgpuclasses", "-o", "name")

    # Nothing that decides who holds a card: a claim's status, ElasticGPUs, GPUDevices,
    # MIGSubstitutions, GPUBudgets and their status.
    refusals = [
        t.refused("patch", "elasticgpuclaim", "mine", "--subresource=status", "--type=merge",
                  "-p", '{"status": {"elasticGPUName": "someone-elses"}}'),
        t.refused("get", "elasticgpus"),
        t.refused("delete", "elasticgpu", claim["status"]["elasticGPUName"]),
        t.refused("create", "-f", "-", input=json.dumps({
            "apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPU",
            "metadata": {"name": "stolen"}, "spec": {}})),
        t.refused("label", "gpudevice", "--all", "taken=yes"),
        t.refused("create", "-f", "-", input=json.dumps({
            "apiVersion": "elasticgpu.io/v1alpha", "kind": "MIGSubstitution",
            "metadata": {"name": "rule"}, "spec": {}})),
        t.refused("create", "-f", "-", input=json.dumps({
            "apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
            "metadata": {"name": "more"}, "spec": {"gpuHours": 1000, "period": "168h"}})),
        t.refused("patch", "gpubudget", "team", "--type=merge", "-p",
                  '{"spec": {"gpuHours": 1000}}'),
        t.refused("patch", "gpubudget", "team", "--subresource=status", "--type=merge",
                  "-p", '{"status": {"used": 0}}'),
        t.refused("delete", "gpubudget", "team"),
    ]
    for refusal in refusals:
        assert "forbidden" in refusal, refusal
    assert not t.can_i("create", "elasticgpuclasses")

    # view reads claims and budgets, and changes none.
    viewer = f"viewer-{t.namespace}"
    kubectl(kc, "create", "rolebinding", "viewer", "-n", t.namespace, "--clusterrole=view",
            f"--user={viewer}")
    as_viewer = Tenant(kc, t.namespace, viewer)
    wait_for("view may read ElasticGPUClaims", lambda: as_viewer.can_i("list", "elasticgpuclaims"),
             lambda: kubectl(kc, "get", "clusterrole", "view", "-o", "yaml")[-2000:])
    assert "mine" in as_viewer.ok("get", "elasticgpuclaims", "-o", "name")
    assert "team" in as_viewer.ok("get", "gpubudgets", "-o", "name")
    assert "forbidden" in as_viewer.refused("delete", "elasticgpuclaim", "mine")


# --- item 16: elasticgpu.io/gpu ----------------------------------------------------------------

def test_the_elastic_gpu_whole_card_name_schedules_with_a_whole_card(
        tenant: Callable[[], Tenant]) -> None:
    t = tenant()
    t.ok("create", "-f", "-", input=gpu_pod("whole", {"elasticgpu.io/gpu": "1"}))
    pod = wait_bound(t, "whole")
    assignment = json.loads(pod["metadata"]["annotations"][ASSIGNMENT])
    (card,) = assignment["containers"]["main"]
    assert card["milli"] == 1000, assignment  # a whole card, exclusively
    # Stored as the shares it stands for, which the agents' share plugin allocates.
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("elasticgpu.io/gpu-core") == "100" and "elasticgpu.io/gpu" not in limits
