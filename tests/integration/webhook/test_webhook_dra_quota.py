"""Issue 41, one quota and one budget across both paths, on the real control plane with
`egpu webhook --quota-resources`: a namespace whose ResourceQuota is one card in canonical units
(`requests.quota.elasticgpu.io/gpu-core: 100`) gets one whole card through a ResourceClaim and
the second whole-card claim pod is refused by kube-apiserver's quota; two 40 % claims fit and a
third does not; a claim shared by two pods is counted once; a pod asking a GPU both ways, or
naming a claim that does not exist, is refused at create; and once the namespace is over its
GPUBudget a claim pod gets the over-budget PriorityClass. The same read of its claims puts the
DRA allocator's placement gate on the pod. No scheduler is needed: quota is counted at
admission (the pods name a scheduler that does not run)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.waiting import wait_for
from egpu_testing.webhook import running_webhook
from elastic_gpu.api.budget import OVER_BUDGET_CLASS
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.classes import CARD_CLASS
from elastic_gpu.core.quota import QUOTA_CORE

pytestmark = pytest.mark.integration

LABEL = "egpu-dra-quota"


def _claim(name: str, ns: str, compute: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CARD_CLASS}
    if compute is not None:
        exactly["capacity"] = {"requests": {"compute": compute, "memory": "1Gi"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def _pod(name: str, ns: str, claim: str, limits: dict[str, str] | None = None,
         template: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {"claims": [{"name": "gpu"}]}
    if limits:
        resources["limits"] = limits
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", key: claim}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": resources}]}}


def test_claims_count_in_the_canonical_quota_and_budget(k8s_cluster: Any, k8s_namespace: str,
                                                        tmp_path: Path) -> None:
    if not k8s_cluster.controller_manager:
        pytest.skip("ResourceQuota needs kube-controller-manager to compute its status")
    from elastic_gpu.kube.crds import install_elasticgpu_crds, install_priority_classes

    install_elasticgpu_crds(k8s_cluster.kube())
    install_priority_classes(k8s_cluster.kube())
    ns = k8s_namespace

    def create(obj: dict[str, Any], ok: bool = True) -> Any:
        done = k8s_cluster.kubectl("create", "-o", "json", "-f", "-", check=ok,
                                   input=json.dumps(obj))
        return json.loads(done.stdout) if ok else done

    def used() -> str:
        status = json.loads(k8s_cluster.kubectl("get", "resourcequota", "gpu", "-n", ns, "-o",
                                                "json").stdout).get("status") or {}
        return str((status.get("used") or {}).get(f"requests.{QUOTA_CORE}"))

    with running_webhook(k8s_cluster, tmp_path, "dra-quota", LABEL,
                         extra_args=["--quota-resources"]) as hook:
        k8s_cluster.kubectl("label", "namespace", ns, f"{LABEL}={hook.name}")
        create({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": ns},
                "spec": {"hard": {f"requests.{QUOTA_CORE}": "100"}}})
        wait_for("the quota's status", lambda: used() == "0", 30)

        # one whole card through a claim: the second whole-card claim pod is refused
        for name in ("card-1", "card-2"):
            create(_claim(name, ns))
        first = create(_pod("whole-1", ns, "card-1"))
        assert first["spec"]["containers"][0]["resources"]["requests"] == {QUOTA_CORE: "100"}
        # the same read of its claims gates it for our allocator (none runs here)
        assert first["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]
        second = create(_pod("whole-2", ns, "card-2"), ok=False)
        assert second.returncode != 0
        assert "exceeded quota: gpu" in second.stderr, second.stderr
        assert f"requested: requests.{QUOTA_CORE}=100" in second.stderr
        # a pod sharing the first one's claim is counted once: with the claim allocated and
        # reserved for its first user (as kube-scheduler writes it), the next pod adds nothing
        k8s_cluster.kubectl("patch", "resourceclaim", "card-1", "-n", ns,
                            "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
                                "allocation": {"devices": {"results": [{
                                    "request": "gpu", "driver": CARD_CLASS, "pool": "n",
                                    "device": "gpu-0"}]}},
                                "reservedFor": [{"resource": "pods", "name": "whole-1",
                                                 "uid": first["metadata"]["uid"]}]}}))
        shared = create(_pod("whole-shared", ns, "card-1"))
        assert "limits" not in shared["spec"]["containers"][0]["resources"]
        assert shared["metadata"]["annotations"]["elasticgpu.io/dra-billed-claims"] == ""
        assert first["metadata"]["annotations"]["elasticgpu.io/dra-billed-claims"] == "gpu"
        for name in ("whole-1", "whole-shared"):
            k8s_cluster.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0",
                                "--force", "--wait=true")
        wait_for("the quota released", lambda: used() == "0", 30)

        # two 40 % claims fit, a third does not
        for name in ("share-1", "share-2", "share-3"):
            create(_claim(name, ns, "40"))
        for name in ("share-1", "share-2"):
            create(_pod(name, ns, name))
        third = create(_pod("share-3", ns, "share-3"), ok=False)
        assert third.returncode != 0 and "exceeded quota: gpu" in third.stderr, third.stderr
        assert f"used: requests.{QUOTA_CORE}=80, limited: requests.{QUOTA_CORE}=100" in \
            third.stderr

        # a GPU asked both ways, and a claim that does not exist: refused, with our rules
        both = create(_pod("both", ns, "share-3", {"nvidia.com/gpu": "1"}), ok=False)
        assert "dra-and-device-plugin" in both.stderr and "nvidia.com/gpu" in both.stderr
        assert "ResourceClaim share-3" in both.stderr
        missing = create(_pod("missing", ns, "no-such", template=True), ok=False)
        assert "dra-claim-not-found" in missing.stderr, missing.stderr

        # over budget: the claim pod gets the lower class, as a device-plugin pod does
        create({"apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
                "metadata": {"name": "small", "namespace": ns},
                "spec": {"gpuHours": 1, "period": "24h"}})
        k8s_cluster.kubectl("patch", "gpubudget", "small", "-n", ns, "--subresource=status",
                            "--type=merge", "-p", json.dumps({"status": {"conditions": [{
                                "type": "OverBudget", "status": "True", "reason": "Spent",
                                "message": "spent",
                                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime())}]}}))
        k8s_cluster.kubectl("delete", "pod", "share-2", "-n", ns, "--grace-period=0",
                            "--force", "--wait=true")

        def lowered() -> bool:
            probe = k8s_cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                        input=json.dumps(_pod("probe", ns, "share-3")))
            return bool(json.loads(probe.stdout)["spec"].get("priorityClassName")
                        == OVER_BUDGET_CLASS)

        wait_for("the webhook seeing OverBudget", lowered, 20)
        pod = create(_pod("over", ns, "share-3"))
        assert pod["spec"]["priorityClassName"] == OVER_BUDGET_CLASS
        assert pod["metadata"]["annotations"]["elasticgpu.io/dra-billed-claims"] == "gpu"
