"""What a DRA-mode agent needs of the API, and no more: the chart's ClusterRole and own-node
admission policy for the DRA node group (agent.dra, docs/dra.md "Deploying a DRA node"), as
`helm template` renders them, applied here to a ServiceAccount of the test's own, with a
token bound to an agent pod on the node (as the DaemonSet's pod has it). The agent starts,
publishes, and prepares a claim with it; it cannot write another node's ResourceSlices or Node
status, list claims, or write a claim's status."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from egpu_testing.chart import token_kubeconfig
from egpu_testing.dra import allocation, claim_manifest, result
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.dra.node import DraNode
from elastic_gpu.agent.dra.slices_api import existing_slices, withdraw_node_slices
from elastic_gpu.agent.proto import dra_v1_pb2, dra_v1_pb2_grpc
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core.dra.devices import node_slices
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.kube.errors import Forbidden
from elastic_gpu.kube.resources import NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[3] / "charts" / "elastic-gpu"
#: The chart's objects for the DRA node group's agent: (kind, name) as rendered.
CHART_OBJECTS = {("ClusterRole", "elastic-gpu-agent-dra"),
                 ("ClusterRoleBinding", "elastic-gpu-agent-dra"),
                 ("ValidatingAdmissionPolicy", "elastic-gpu-agent-own-node"),
                 ("ValidatingAdmissionPolicyBinding", "elastic-gpu-agent-own-node")}
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 40960}]}


def manifests(name: str, namespace: str) -> list[dict[str, Any]]:
    """The chart's RBAC and own-node policy for the DRA agent (`helm template` with
    agent.dra.enabled), as rendered, but named for the test's own account (`name`), so that
    they meet no other test's objects."""
    from elastic_gpu.devcluster.binaries import find_bin_dir

    out = subprocess.run([str(find_bin_dir() / "helm"), "template", "egpu", str(CHART), "-n",
                          namespace, "--set", "agent.dra.enabled=true"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    chart_account = f"system:serviceaccount:{namespace}:elastic-gpu-agent-dra"
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                                   "metadata": {"name": name, "namespace": namespace}}]
    for doc in yaml.safe_load_all(out):
        if not doc or (doc["kind"], doc["metadata"]["name"]) not in CHART_OBJECTS:
            continue
        doc["metadata"] = {"name": name}
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = name
            doc["subjects"] = [{"kind": "ServiceAccount", "name": name,
                                "namespace": namespace}]
        elif doc["kind"] == "ValidatingAdmissionPolicy":
            (condition,) = doc["spec"]["matchConditions"]
            assert chart_account in condition["expression"], condition
            condition["expression"] = condition["expression"].replace(
                chart_account, f"system:serviceaccount:{namespace}:{name}")
        elif doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"]["policyName"] = name
        docs.append(doc)
    assert len(docs) == 1 + len(CHART_OBJECTS), [d["kind"] for d in docs]
    return docs


@pytest.fixture
def work() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="egpu-drr-"))  # short: unix socket paths
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_documented_rbac_and_policy_are_enough_and_no_more(
        k8s_cluster: Any, k8s_namespace: str, work: Path) -> None:
    from egpu_testing.pytest_plugin import unique_name

    admin = k8s_cluster.kube()
    node, other = unique_name("drr"), unique_name("drr-other")
    for name in (node, other):
        admin.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {GPU_MODE_LABEL: "dra"}}})
    account = unique_name("egpu-dra-agent")
    docs = manifests(account, k8s_namespace)
    k8s_cluster.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d)
                                                                  for d in docs))
    pod = admin.create(PODS.path(namespace=k8s_namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent"},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "agent", "image": "elastic-gpu"}]}})
    kubeconfig = token_kubeconfig(k8s_cluster, k8s_namespace, account, work / "kubeconfig",
                                  bound_pod=("agent", pod["metadata"]["uid"]))
    agent_api = SyncKubeClient.from_config(kubeconfig, field_manager="egpu-agent")
    running: Agent | None = None
    try:
        foreign = node_slices(other, [], 1)[0]
        foreign["spec"]["devices"] = [{"name": "gpu-0"}]
        # the admission policy takes effect a moment after it is created
        deadline = time.monotonic() + 15
        while True:
            try:
                agent_api.create(RESOURCE_SLICES.path(), foreign)
            except Forbidden as err:
                if "its own node" in str(err):
                    break
                raise
            withdraw_node_slices(admin, other)
            assert time.monotonic() < deadline, "ValidatingAdmissionPolicy never took effect"
            time.sleep(0.2)

        config = parse_config({"syncSeconds": 3600, "usage": {"enabled": False}, "dra": {
            "enabled": True, "pluginDirectory": str(work / "plugin"),
            "registryDirectory": str(work / "registry"), "cdiDirectory": str(work / "cdi")}})
        running = Agent(config, FakeBackend.from_dict(INVENTORY, node), node, client=agent_api)
        running.start()
        assert [s["metadata"]["name"] for s in existing_slices(admin, node)] == [
            f"{node}-gpu.elasticgpu.io"]
        claim = admin.create(RESOURCE_CLAIMS.path(namespace=k8s_namespace),
                             claim_manifest("c", k8s_namespace))
        claim["status"] = {"allocation": allocation(node, [result(node, "gpu-0")]),
                           "reservedFor": [{"resource": "pods", "name": "agent",
                                            "uid": pod["metadata"]["uid"]}]}
        admin.update(RESOURCE_CLAIMS.path(namespace=k8s_namespace, name="c",
                                          subresource="status"), claim)
        assert isinstance(running.mode, DraNode)
        with grpc.insecure_channel(f"unix://{running.mode.server.service_socket}") as channel:
            answer = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
                    namespace=k8s_namespace, name="c", uid=claim["metadata"]["uid"])]),
                timeout=10)
        assert answer.claims[claim["metadata"]["uid"]].error == ""

        # claims may be listed (dynamic MIG's applier: a card a claim holds is never changed)
        listed, _ = agent_api.list(RESOURCE_CLAIMS.path(namespace=k8s_namespace))
        assert [c["metadata"]["name"] for c in listed] == ["c"]
        # what it may not do: another node's slices and Node, claims beyond get and list
        admin.create(RESOURCE_SLICES.path(), foreign)
        with pytest.raises(Forbidden, match="its own node"):
            agent_api.delete(RESOURCE_SLICES.path(name=foreign["metadata"]["name"]))
        with pytest.raises(Forbidden, match="its own Node"):
            agent_api.patch(NODES.path(name=other, subresource="status"),
                            {"status": {"capacity": {"x.example.com/y": "1"}}})
        with pytest.raises(Forbidden):
            agent_api.update(RESOURCE_CLAIMS.path(namespace=k8s_namespace, name="c",
                                                  subresource="status"), claim)
    finally:
        if running is not None:
            running.stop()
        agent_api.close()
        for name in (node, other):
            withdraw_node_slices(admin, name)
            admin.delete(NODES.path(name=name))
        for doc in docs:
            if doc["kind"] != "ServiceAccount":
                k8s_cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"],
                                    check=False)
