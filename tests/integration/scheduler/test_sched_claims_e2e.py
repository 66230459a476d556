"""The extender and the Elastic GPU API on a real control plane (issue #15): `POST /provision`,
ElasticGPUs in the ledger, pods that name claims placed by the real kube-scheduler on their
claim's ElasticGPU, WaitForFirstConsumer provisioned at bind, and a SIGKILLed extender that
rebuilds the same holds from the API.

`egpu controller` is built elsewhere: where it would bind a claim, the test writes what it
writes (`egpu_testing.claims.bind_claim_as_controller`). Pods are created with the claim's
resources already in the container, as the admission webhook leaves them.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import (
    bind_claim_as_controller,
    claim_object,
    claim_pod,
    class_object,
    get_json,
    install_crds,
)
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import (
    create_pods,
    pods_by_name,
    unschedulable_reason,
    wait_bound,
    wait_extender_knows,
)
from egpu_testing.workbench import (
    ExtenderProcess,
    metric_value,
    metrics_text,
    pod_manifest,
    running_extender,
)
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment

pytestmark = pytest.mark.integration

SHARE = "gpushare.provisioner.elasticgpu.io/gpu-core"
CORE = "elasticgpu.io/gpu-core"


class Claims:
    def __init__(self, cluster: Any, extender: ExtenderProcess, scheduler_name: str,
                 namespace: str) -> None:
        self.cluster = cluster
        self.extender = extender
        self.scheduler_name = scheduler_name
        self.namespace = namespace
        self.client = cluster.client()
        self.claim_uids: list[str] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = json.loads(self.cluster.kubectl(
            "create", "-o", "json", "-f", "-", input=json.dumps(obj)).stdout)
        if created.get("kind") == "ElasticGPUClaim":
            self.claim_uids.append(created["metadata"]["uid"])
        return created

    def delete_provisioned(self) -> None:
        """Deletes the ElasticGPUs provisioned for this test's claims (named egpu-<claim uid>)
        and no others: the cluster is shared by the whole session, and `delete egpu --all`
        once waited out its 60 s deleting every other module's ElasticGPUs one by one."""
        names = [f"egpu-{uid}" for uid in self.claim_uids]
        if names:
            self.cluster.kubectl("delete", "egpu", *names, "--ignore-not-found", "--wait=false",
                                 check=False)

    def provision(self, claim: dict[str, Any]) -> tuple[int, Any]:
        meta = claim["metadata"]
        body = {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}
        request = urllib.request.Request(f"{self.extender.url}/provision",
                                         data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def pod(self, name: str, claims: dict[str, str], resources: dict[str, dict[str, str]]
            ) -> None:
        pod = claim_pod(name, claims, namespace=self.namespace, resources=resources)
        del pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
        pod["spec"]["schedulerName"] = self.scheduler_name
        create_pods(self.client, [pod])

    def plain_pod(self, name: str, percent: int) -> None:
        create_pods(self.client, [pod_manifest(name, self.namespace,
                                               limits={CORE: str(percent)},
                                               scheduler_name=self.scheduler_name)])

    def used(self, node: str, card: int = 0) -> float | None:
        return metric_value(metrics_text(self.extender.url),
                            f'elasticgpu_scheduler_card_compute_allocated_millicards{{device_index="{card}",node="{node}"}}')

    def wait_used(self, node: str, milli: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.used(node) != milli:
            assert time.monotonic() < deadline, \
                f"{node} card 0: {self.used(node)} milli, not {milli}\n{self.extender.log_tail()}"
            time.sleep(0.2)

    def unschedulable_reason(self, name: str, timeout_s: float = 30.0) -> str:
        return unschedulable_reason(self.client, self.namespace, name, timeout_s)


@pytest.fixture
def claims(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
           k8s_namespace: str) -> Iterator[Claims]:
    install_crds(k8s_cluster)
    with running_extender(k8s_cluster, tmp_path, kube_scheduler=start_kube_scheduler) as extender:
        yield Claims(k8s_cluster, extender, extender.scheduler_name, k8s_namespace)


def assignment_of(pod: dict[str, Any]) -> Assignment:
    assignment = Assignment.from_json(pod["metadata"]["annotations"][ann.ASSIGNMENT])
    assert assignment.node == pod["spec"]["nodeName"]
    return assignment


def test_provisioned_cards_are_refused_to_pods_and_consumers_get_them(
        claims: Claims, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    """/provision creates the ElasticGPU; its cards are refused to other pods; a pod naming
    the claim (created before the claim was provisioned: it waits, and is woken when the
    ElasticGPU appears) and a second one (after the controller bound the claim) run on the
    ElasticGPU's node with its cards; a SIGKILLed extender rebuilds the same holds."""
    (node,) = fake_gpu_nodes(1, gpus=1)
    wait_extender_knows(claims.extender.url, [node], 1)
    cls = unique_name("share")
    claims.create(class_object(cls))
    try:
        claim = claims.create(claim_object("c1", {SHARE: 60}, namespace=claims.namespace,
                                           class_name=cls))
        # a consumer created before its claim is provisioned: no node fits, with the reason
        claims.pod("early", {"main": "c1"}, {"main": {CORE: "60"}})
        reason = claims.unschedulable_reason("early")
        assert f"ElasticGPUClaim {claims.namespace}/c1 is Pending: not bound yet" in reason

        status, answer = claims.provision(claim)
        uid = claim["metadata"]["uid"]
        assert (status, answer) == (200, {"result": "Provisioned", "elasticGPU": f"egpu-{uid}",
                                          "node": node}), claims.extender.log_tail()
        egpu = api.elasticgpu_from_object(get_json(claims.cluster, "egpu", f"egpu-{uid}"))
        assert egpu.node == node and [s.milli for s in egpu.shares] == [600]
        assert egpu.claim_ref is not None and egpu.claim_ref.uid == uid
        assert claims.provision(claim) == (200, answer)  # idempotent
        claims.wait_used(node, 600)

        # woken when the ElasticGPU appeared (kube-scheduler alone would retry in 5 minutes)
        early = wait_bound(claims.client, claims.namespace, ["early"], timeout_s=20)["early"]
        assignment = assignment_of(early)
        assert assignment.claims == {"main": egpu.name}
        assert assignment.containers["main"] == egpu.shares

        # the ElasticGPU's 60% are not given to anyone else: 50% does not fit, 40% does
        claims.plain_pod("fifty", 50)
        assert "0/1 cards have 50% compute" in claims.unschedulable_reason("fifty")
        claims.plain_pod("forty", 40)
        wait_bound(claims.client, claims.namespace, ["forty"])
        claims.wait_used(node, 1000)  # 600 once (the consumer adds nothing) + 400

        bind_claim_as_controller(claims.cluster, claims.namespace, "c1", egpu.name)
        claims.pod("late", {"main": "c1"}, {"main": {CORE: "60"}})
        late = wait_bound(claims.client, claims.namespace, ["late"])["late"]
        assert assignment_of(late).containers["main"] == egpu.shares
        claims.wait_used(node, 1000)

        # SIGKILL: a fresh extender lists the API and holds exactly the same
        before = metrics_text(claims.extender.url)
        claims.extender.kill()
        claims.extender.start()
        claims.wait_used(node, 1000)
        after = metrics_text(claims.extender.url)
        for sample in (f'elasticgpu_scheduler_elasticgpus_held{{node="{node}"}}',
                       f'elasticgpu_scheduler_elasticgpu_compute_held_millicards{{node="{node}"}}'):
            assert metric_value(before, sample) == metric_value(after, sample) is not None
        held = f'elasticgpu_scheduler_elasticgpu_compute_held_millicards{{node="{node}"}}'
        assert metric_value(after, held) == 600
        assert not pods_by_name(claims.client, claims.namespace)["fifty"]["spec"].get("nodeName")
    finally:
        claims.cluster.kubectl("delete", "egpuclass", cls, "--ignore-not-found")
        claims.delete_provisioned()


def test_a_wait_for_first_consumer_claim_is_provisioned_on_its_first_pods_node(
        claims: Claims, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    nodes = fake_gpu_nodes(2, gpus=1)
    wait_extender_knows(claims.extender.url, nodes, 1)
    cls = unique_name("wffc")
    claims.create(class_object(cls, mode="WaitForFirstConsumer"))
    try:
        claim = claims.create(claim_object("w1", {SHARE: 30}, namespace=claims.namespace,
                                           class_name=cls))
        uid = claim["metadata"]["uid"]
        status, answer = claims.provision(claim)
        assert (status, answer["result"], answer["reason"]) == (200, "Pending",
                                                                "WaitForFirstConsumer")
        claims.pod("first", {"main": "w1"}, {"main": {CORE: "30"}, "side": {CORE: "20"}})
        pod = wait_bound(claims.client, claims.namespace, ["first"])["first"]
        egpu = api.elasticgpu_from_object(get_json(claims.cluster, "egpu", f"egpu-{uid}"))
        assert egpu.node == pod["spec"]["nodeName"]
        assert egpu.claim_ref is not None and egpu.claim_ref.uid == uid
        assert [s.milli for s in egpu.shares] == [300]
        assignment = assignment_of(pod)
        assert assignment.claims == {"main": egpu.name}
        assert assignment.containers["main"] == egpu.shares
        assert [s.milli for s in assignment.containers["side"]] == [200]
        claims.wait_used(egpu.node, 500)
        # a second pod naming it uses the same ElasticGPU, on its node
        claims.pod("second", {"main": "w1"}, {"main": {CORE: "30"}})
        second = wait_bound(claims.client, claims.namespace, ["second"])["second"]
        assert assignment_of(second).containers["main"] == egpu.shares
        assert second["spec"]["nodeName"] == egpu.node
        assert [e["metadata"]["name"] for e in get_json(claims.cluster, "egpu")["items"]
                if e["spec"].get("claimRef", {}).get("uid") == uid] == [egpu.name]
        claims.wait_used(egpu.node, 500)
    finally:
        claims.cluster.kubectl("delete", "egpuclass", cls, "--ignore-not-found")
        claims.delete_provisioned()
