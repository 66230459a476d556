"""Issue 41, the policy `elastic-gpu-dra-gate` (`api.admission_policies`, in the chart and the
sandbox beside the ledger's):

- the extender's ServiceAccount may patch every pod (to lift the DRA allocator's scheduling
  gate), so it is narrowed, as NodeRestriction narrows a kubelet: as that account, removing the
  gate `elasticgpu.io/dra-placement` is allowed, and nothing else is (a label, another
  scheduler's gate, an image);
- a tenant (`edit`) may not remove the gate (kube-scheduler would allocate her claim while our
  allocator writes another on the same card), though she may change the pod otherwise and lift
  her own gates; an admin (the system) may."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.sandbox import kubectl, kubectl_run
from egpu_testing.tenant import make_tenant
from elastic_gpu.api.admission_policies import DRA_GATE, SCHEDULER_ACCOUNT
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.kube.resources import PODS

pytestmark = pytest.mark.integration

OTHER_GATE = "example.com/quota-admission"


def _pod(name: str, gates: list[str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulingGates": [{"name": g} for g in gates],
                     "containers": [{"name": "main", "image": "registry.example/cuda:12"}]}}


@pytest.mark.usefixtures("dra_gate_policy")
def test_the_extenders_account_may_only_remove_the_dra_gate(k8s_cluster: ControlPlane) -> None:
    kubeconfig = Path(k8s_cluster.kubeconfig)
    kube = k8s_cluster.kube()
    namespace = unique_name("gatepolicy")
    kubectl(kubeconfig, "create", "namespace", namespace)
    account = f"system:serviceaccount:{namespace}:{SCHEDULER_ACCOUNT}"
    # the chart's rule for the account (pods patch), here in one namespace
    kubectl(kubeconfig, "-n", namespace, "create", "role", "pod-patcher", "--verb=get,patch",
            "--resource=pods")
    kubectl(kubeconfig, "-n", namespace, "create", "rolebinding", "pod-patcher",
            "--role=pod-patcher", f"--serviceaccount={namespace}:{SCHEDULER_ACCOUNT}")
    for name in ("p1", "p2"):
        kube.create(PODS.path(namespace), _pod(name, [DRA_PLACEMENT_GATE, OTHER_GATE]))

    def as_account(name: str, *patch: str) -> Any:
        return kubectl_run(kubeconfig, f"--as={account}", "-n", namespace, "patch", "pod",
                           name, *patch)

    def json_patch(ops: list[dict[str, Any]]) -> tuple[str, str]:
        return "--type=json", f"-p={json.dumps(ops)}"

    relabel = as_account("p1", "--type=merge", '-p={"metadata":{"labels":{"x":"y"}}}')
    assert relabel.returncode != 0, "the account relabelled a pod"
    assert DRA_GATE in relabel.stderr
    assert f"may change a pod only by removing the scheduling gate {DRA_PLACEMENT_GATE}" in \
        relabel.stderr
    # another scheduler's gate, an image: refused
    other = as_account("p1", *json_patch([{"op": "replace", "path": "/spec/schedulingGates",
                                           "value": [{"name": DRA_PLACEMENT_GATE}]}]))
    assert other.returncode != 0 and DRA_GATE in other.stderr
    image = as_account("p1", *json_patch([{"op": "replace", "path": "/spec/containers/0/image",
                                           "value": "evil.example/miner"}]))
    assert image.returncode != 0 and DRA_GATE in image.stderr
    # the allocator's own patch (`dra_allocator._lift`): the gates it read tested, ours removed
    gates = [{"name": DRA_PLACEMENT_GATE}, {"name": OTHER_GATE}]
    lift = as_account("p1", *json_patch([
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": OTHER_GATE}]}]))
    assert lift.returncode == 0, lift.stderr
    assert kube.get(PODS.path(namespace, "p1"))["spec"]["schedulingGates"] == [
        {"name": OTHER_GATE}]
    # with ours gone there is nothing left for the account to do
    again = as_account("p1", *json_patch([{"op": "remove", "path": "/spec/schedulingGates"}]))
    assert again.returncode != 0 and DRA_GATE in again.stderr
    # an admin is not narrowed
    kubectl(kubeconfig, "-n", namespace, "label", "pod", "p2", "team=a")
    kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")


@pytest.mark.usefixtures("dra_gate_policy")
def test_a_tenant_may_not_remove_the_dra_gate(k8s_cluster: ControlPlane) -> None:
    kubeconfig = Path(k8s_cluster.kubeconfig)
    kube = k8s_cluster.kube()
    namespace = unique_name("gatetenant")
    tenant = make_tenant(kubeconfig, namespace)
    for name in ("p1", "p2"):
        kube.create(PODS.path(namespace), _pod(name, [DRA_PLACEMENT_GATE, OTHER_GATE]))
    remove_all = ("--type=json", '-p=[{"op": "remove", "path": "/spec/schedulingGates"}]')
    refused = tenant.run("patch", "pod", "p1", *remove_all)
    assert refused.returncode != 0, "the tenant removed the DRA gate"
    assert DRA_GATE in refused.stderr and "Forbidden" in refused.stderr
    assert (f"the scheduling gate {DRA_PLACEMENT_GATE} is removed only by the Elastic GPU "
            "scheduler") in refused.stderr
    # ours alone removed, others kept: refused too
    only_ours = tenant.run("patch", "pod", "p1", "--type=json", "-p=" + json.dumps([
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": OTHER_GATE}]}]))
    assert only_ours.returncode != 0 and DRA_GATE in only_ours.stderr
    assert kube.get(PODS.path(namespace, "p1"))["spec"]["schedulingGates"] == [
        {"name": DRA_PLACEMENT_GATE}, {"name": OTHER_GATE}]
    # anything else on her gated pod she may still do: a label, her own gate lifted
    tenant.ok("label", "pod", "p1", "team=a")
    tenant.ok("patch", "pod", "p1", "--type=json", "-p=" + json.dumps([
        {"op": "replace", "path": "/spec/schedulingGates",
         "value": [{"name": DRA_PLACEMENT_GATE}]}]))
    # the system (an admin here: `*` holds write on ledger.elasticgpu.io) may
    kubectl(kubeconfig, "-n", namespace, "patch", "pod", "p2", *remove_all)
    assert "schedulingGates" not in kube.get(PODS.path(namespace, "p2"))["spec"]
    kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")

