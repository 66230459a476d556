"""Issue #17 through the real kube-scheduler with the extender (the sandbox's scheduler
configuration, `devcluster.components.scheduler_config`, under its own schedulerName), `egpu
webhook --quota-resources` and the budget keeper:

- must-show 2, the first end-to-end preemption: on a node with CPU to spare (64 cores) and both
  cards held, an in-budget GPU pod that needs a whole card evicts the over-budget pods (given
  `egpu-over-budget` by the webhook because their namespace's GPUBudget is spent) that hold
  one, never the in-budget pod holding the other, and is bound on the freed card. The shortage
  is GPU only: kube-scheduler sees it through `node.elasticgpu.io/gpu-core` (the agent
  advertises 100 per card, the webhook adds the pods' counts; `core/nodefit.py`), so its
  DefaultPreemption proposes victims and the extender's `preempt` verb refines them per card;
- must-show 4, end to end: a ResourceQuota of one card in canonical units admits two
  `vcuda-core: 50` pods, `kubectl create` refuses the third with the quota's message, and the
  two are bound (kube-scheduler ignores the quota's names, as the configuration says).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node as K8sNode

from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name, wait_default_service_account
from egpu_testing.scenario import pods_by_name, wait_bound, wait_extender_knows
from egpu_testing.waiting import wait_for
from egpu_testing.webhook import WebhookProcess, running_webhook
from egpu_testing.workbench import ExtenderProcess, metric_value
from elastic_gpu.api.budget import OVER_BUDGET_CLASS, OVER_BUDGET_VALUE
from elastic_gpu.core.annotations import ASSIGNMENT
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import QUOTA_CORE
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

LABEL = "egpu-budget-sched"


@dataclass
class System:
    extender: ExtenderProcess
    webhook: WebhookProcess
    scheduler: str

    def namespace(self, plane: Any) -> str:
        name = unique_name("t")
        plane.kubectl("create", "namespace", name)
        plane.kubectl("label", "namespace", name, f"{LABEL}={self.webhook.name}")
        wait_default_service_account(plane, name)
        return name

    def pod(self, name: str, ns: str, cpu: str, core: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"schedulerName": self.scheduler, "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "cuda", "resources": {
                             "requests": {"cpu": cpu},
                             "limits": {"cpu": cpu, "tencent.com/vcuda-core": core}}}]}}

    def preempt_calls(self) -> float:
        with urllib.request.urlopen(f"{self.extender.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        value = metric_value(text, 'elasticgpu_scheduler_request_duration_seconds_count'
                                   '{verb="preempt"}')
        return value or 0.0


@pytest.fixture
def system(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
           ) -> Iterator[System]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.devcluster.components import scheduler_config
    from elastic_gpu.kube.crds import install_elasticgpu_crds, install_priority_classes

    ensure_crd(k8s_cluster.kube())
    install_elasticgpu_crds(k8s_cluster.kube())
    install_priority_classes(k8s_cluster.kube())
    port, metrics = free_ports(2)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    extender.start()
    name = extender.scheduler_name
    config = scheduler_config(None, [extender.url])  # the sandbox's
    config["profiles"][0]["schedulerName"] = name
    start_kube_scheduler(config)
    keeper = ControllerProcess(k8s_cluster.kubeconfig, metrics, tmp_path / "controller.log",
                               extender_url=extender.url, identity=unique_name("keeper"),
                               lease_name=unique_name("budget-sched"), lease=(4, 3, 0.5),
                               extra=["--only", "budgets"])
    keeper.start()
    try:
        with running_webhook(k8s_cluster, tmp_path, "budget-sched", LABEL,
                             extra_args=["--quota-resources"]) as hook:
            yield System(extender, hook, name)
    finally:
        keeper.stop()
        extender.stop()


def test_in_budget_pod_preempts_over_budget_holders_not_in_budget_ones(
        k8s_cluster: Any, system: System, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    client = k8s_cluster.client()
    (node,) = fake_gpu_nodes(1, gpus=2, cpu_milli=64000)  # CPU to spare: the shortage is GPU
    capacity = client.get(K8sNode, node).status.capacity
    assert str(capacity[NODE_CORE]) == "200", "the agent advertises 100 per card"
    wait_extender_knows(system.extender.url, [node], 2)
    team, spent = system.namespace(k8s_cluster), system.namespace(k8s_cluster)
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
        "metadata": {"name": "none-left", "namespace": spent},
        "spec": {"gpuHours": 0, "period": "24h"}}))  # a zero budget is always over

    def over() -> bool:
        obj = json.loads(k8s_cluster.kubectl("get", "gpubudget", "none-left", "-n", spent,
                                             "-o", "json").stdout)
        return any(c["type"] == "OverBudget" and c["status"] == "True"
                   for c in (obj.get("status") or {}).get("conditions") or [])

    def create(pod: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(k8s_cluster.kubectl(
            "create", "-o", "json", "-f", "-", input=json.dumps(pod)).stdout)
        return out

    wait_for("the spent namespace OverBudget", over, 30)
    wait_for("the webhook seeing it", lambda: json.loads(k8s_cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(
            system.pod("probe", spent, "1", "50"))).stdout)["spec"].get(
        "priorityClassName") == OVER_BUDGET_CLASS, 10)

    # card 0: an in-budget pod; card 1: two over-budget halves. Both cards are full, CPU is not.
    keep = create(system.pod("keep", team, "1", "100"))
    assert "priorityClassName" not in keep["spec"]
    assert keep["spec"]["containers"][0]["resources"]["limits"][NODE_CORE] == "100"
    wait_bound(client, team, ["keep"])
    for name in ("over-a", "over-b"):
        pod = create(system.pod(name, spent, "1", "50"))
        assert pod["spec"]["priority"] == OVER_BUDGET_VALUE
        assert pod["spec"]["containers"][0]["resources"]["limits"][NODE_CORE] == "50"
    wait_bound(client, spent, ["over-a", "over-b"])
    uids = {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in pods_by_name(client, spent).values()}
    calls = system.preempt_calls()

    # an in-budget pod needing a whole card: only the over-budget pods can go, and both must
    create(system.pod("needs-room", team, "1", "100"))
    bound = wait_bound(client, team, ["needs-room"], 90)
    assert bound["needs-room"]["spec"]["nodeName"] == node
    assert system.preempt_calls() > calls, "the extender's preempt verb was asked"
    left = pods_by_name(client, spent)
    assert not any(p["metadata"]["uid"] in uids.values() and
                   not p["metadata"].get("deletionTimestamp") for p in left.values()), left
    survivor = pods_by_name(client, team)["keep"]
    assert survivor["metadata"]["uid"] == keep["metadata"]["uid"]
    assert not survivor["metadata"].get("deletionTimestamp"), "the in-budget pod stays"
    assignment = Assignment.from_json(bound["needs-room"]["metadata"]["annotations"][ASSIGNMENT])
    assert [s.index for s in assignment.containers["main"]] == [1], "the freed card"


def test_quota_of_one_card_in_canonical_units_through_webhook_and_scheduler(
        k8s_cluster: Any, system: System, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    if not k8s_cluster.controller_manager:
        pytest.skip("ResourceQuota needs kube-controller-manager to compute its status")
    client = k8s_cluster.client()
    (node,) = fake_gpu_nodes(1, gpus=2)
    wait_extender_knows(system.extender.url, [node], 2)
    ns = system.namespace(k8s_cluster)
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {f"requests.{QUOTA_CORE}": "100"}}}))
    wait_for("the quota's status", lambda: json.loads(k8s_cluster.kubectl(
        "get", "resourcequota", "gpu", "-n", ns, "-o", "json").stdout).get(
        "status", {}).get("hard"), 30)
    for name, alias in (("a", "tencent.com/vcuda-core"), ("b", "nano-gpu/gpu-percent")):
        pod = system.pod(name, ns, "100m", "50")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        limits[alias] = limits.pop("tencent.com/vcuda-core")
        k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    third = k8s_cluster.kubectl("create", "-f", "-", check=False,
                                input=json.dumps(system.pod("c", ns, "100m", "50")))
    print(third.stderr)
    assert third.returncode != 0
    assert 'pods "c" is forbidden: exceeded quota: gpu' in third.stderr, third.stderr
    assert f"requested: requests.{QUOTA_CORE}=50" in third.stderr
    assert f"used: requests.{QUOTA_CORE}=100, limited: requests.{QUOTA_CORE}=100" in third.stderr
    pods = wait_bound(client, ns, ["a", "b"], 60)
    for pod in pods.values():
        requests = pod["spec"]["containers"][0]["resources"]["requests"]
        assert requests[QUOTA_CORE] == "50"
        assert pod["spec"]["nodeName"] == node
