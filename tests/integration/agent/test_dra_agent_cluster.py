"""The agent in DRA mode against a real API server: its ResourceSlices, the Node's status, no
GPUDevices, and the kubelet's DRA plugin on real unix sockets, called through a real gRPC
client the way kubelet calls it. The claims' allocations are written by the test as an admin
(kube-scheduler's DynamicResources plugin writes them in a cluster); each is reserved for a
real Pod that references it, so kube-controller-manager's claim controller keeps the
reservation. kubelet's side is this test: the Node is a plain Node object."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from egpu_testing.dra import allocation, claim_manifest, env_of, result
from egpu_testing.dra_ledger import prepared_over_capacity
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.dra.cdi import spec_file
from elastic_gpu.agent.dra.kubelet_plugin import registration_socket
from elastic_gpu.agent.dra.node import DraNode
from elastic_gpu.agent.dra.slices_api import existing_slices, withdraw_node_slices
from elastic_gpu.agent.grant import build_grant
from elastic_gpu.agent.nodemode import NodeModeError
from elastic_gpu.agent.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.capacity_guard import REASON as OVER_CAPACITY
from elastic_gpu.core.dra.devices import DRIVER, UNHEALTHY_TAINT, slice_name
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.model import Health, Node
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import EVENTS, GPUDEVICES, NODES, PODS, RESOURCE_CLAIMS
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
INVENTORY: dict[str, Any] = {
    "cards": [{"model": "A100", "memoryMiB": 40960}, {"model": "A100", "memoryMiB": 40960},
              {"model": "A100", "memoryMiB": 40960,
               "mig": [{"profile": "3g.20gb", "uuid": "MIG-q", "start": 0}]}],
}


@pytest.fixture
def api(k8s_cluster: Any) -> Iterator[SyncKubeClient]:
    with SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig),
                                    field_manager="egpu-dev") as client:
        yield client


@pytest.fixture
def node(k8s_cluster: Any, api: SyncKubeClient) -> Iterator[str]:
    from egpu_testing.pytest_plugin import unique_name

    # the GPUDevice kind is served, so "no GPUDevice of this node" is a real answer
    k8s_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds" / "gpudevices.yaml"))
    k8s_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/gpudevices.elasticgpu.io")
    wait_for(lambda: k8s_cluster.kubectl("get", "gpudevices", check=False).returncode == 0)
    name = unique_name("dra")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "250"}
    api.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {GPU_MODE_LABEL: "dra"}},
        "status": {"capacity": resources, "allocatable": resources}})
    yield name
    withdraw_node_slices(api, name)
    with contextlib.suppress(NotFound):
        api.delete(NODES.path(name=name))


@pytest.fixture
def dirs() -> Iterator[dict[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="egpu-dra-"))  # short: unix socket paths
    yield {"pluginDirectory": str(root / "plugin"), "registryDirectory": str(root / "registry"),
           "cdiDirectory": str(root / "cdi")}
    shutil.rmtree(root, ignore_errors=True)


def dra_config(dirs: dict[str, str]) -> Any:
    return parse_config({"sharing": {"mode": "mps"}, "healthCheck": {"pollSeconds": 0.05},
                         "syncSeconds": 3600, "usage": {"enabled": False},
                         "dra": {"enabled": True, **dirs}})


@pytest.fixture
def start_agent(node: str, api: SyncKubeClient, dirs: dict[str, str]
                ) -> Iterator[Callable[[], tuple[Agent, FakeBackend]]]:
    running: list[Agent] = []

    def start() -> tuple[Agent, FakeBackend]:
        backend = FakeBackend.from_dict(INVENTORY, node)
        agent = Agent(dra_config(dirs), backend, node, client=api)
        running.append(agent)
        agent.start()
        return agent, backend

    yield start
    for agent in running:
        agent.stop()


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def allocated_claim(api: SyncKubeClient, namespace: str, name: str, node: str,
                    results: list[dict[str, Any]] | None,
                    capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A claim, a Pod that uses it, and (unless `results` is None) its allocation and the
    Pod's reservation written as kube-scheduler would write them."""
    claim = api.create(RESOURCE_CLAIMS.path(namespace=namespace),
                       claim_manifest(name, namespace, capacity=capacity))
    pod = api.create(PODS.path(namespace=namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-user"},
        "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu",
                                                        "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})
    if results is None:
        return claim
    claim["status"] = {"allocation": allocation(node, results), "reservedFor": [
        {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]}
    return api.update(RESOURCE_CLAIMS.path(namespace=namespace, name=name,
                                           subresource="status"), claim)


def ref(claim: dict[str, Any], uid: str | None = None) -> dra_v1_pb2.Claim:
    meta = claim["metadata"]
    return dra_v1_pb2.Claim(namespace=meta["namespace"], name=meta["name"],
                            uid=uid or meta["uid"])


def prepare(agent: Agent, *claims: dra_v1_pb2.Claim) -> dra_v1_pb2.NodePrepareResourcesResponse:
    assert isinstance(agent.mode, DraNode)
    with grpc.insecure_channel(f"unix://{agent.mode.server.service_socket}") as channel:
        return dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=list(claims)), timeout=10)


def unprepare(agent: Agent, *claims: dra_v1_pb2.Claim
              ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
    assert isinstance(agent.mode, DraNode)
    with grpc.insecure_channel(f"unix://{agent.mode.server.service_socket}") as channel:
        return dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=10)


def test_dra_node_publishes_slices_and_its_core_count_and_no_gpudevices(
        start_agent: Callable[[], tuple[Agent, FakeBackend]], node: str,
        api: SyncKubeClient, dirs: dict[str, str]) -> None:
    agent, backend = start_agent()
    slices = existing_slices(api, node)
    devices = sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])
    assert devices == ["gpu-0", "gpu-1", "gpu-2-mig-0-3g-20gb"]
    status = api.get(NODES.path(name=node))["status"]
    ours = {k: v for k, v in status["capacity"].items() if "gpu" in k}
    # the node-level count, and the quota's accounting names an nvidia.com/gpu pod also asks
    assert ours == {NODE_CORE: "300", "quota.elasticgpu.io/gpu-core": "1G",
                    "quota.elasticgpu.io/gpu-memory": "1G"}  # 1000000000, as the API writes it
    assert {k: v for k, v in status["allocatable"].items() if "gpu" in k} == ours
    gpudevices, _ = api.list(GPUDEVICES.path(), {"labelSelector": f"elasticgpu.io/node={node}"})
    assert gpudevices == []
    # a resync with nothing changed writes no slice (nor, by the same comparison, the status)
    assert isinstance(agent.mode, DraNode) and agent.mode.publish() is False
    # the registration kubelet's plugin watcher reads
    with grpc.insecure_channel(f"unix://{registration_socket(Path(dirs['registryDirectory']))}") as ch:
        registration = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
        info = registration.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DRAPlugin", DRIVER, ["v1.DRAPlugin"])
        # a starting kubelet deletes its node's DRA slices, then registers the plugin again:
        # the agent publishes them again
        withdraw_node_slices(api, node)
        registration.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(
            plugin_registered=True), timeout=5)
        wait_for(lambda: len(existing_slices(api, node)) == 2)
    slices = existing_slices(api, node)
    # a card turns unhealthy: the slices say so with the taint, at a new generation
    generation = slices[0]["spec"]["pool"]["generation"]
    backend.set_health(f"GPU-fake-{node}-1", Health.UNHEALTHY, "XID 79")

    def devices_slice() -> dict[str, Any]:
        (found,) = [s for s in existing_slices(api, node)
                    if s["metadata"]["name"] == slice_name(node)]
        return found

    def tainted() -> bool:
        now = devices_slice()
        by_name = {d["name"]: d for d in now["spec"]["devices"]}
        return bool(by_name["gpu-1"].get("taints")) and \
            now["spec"]["pool"]["generation"] > generation
    wait_for(tainted)
    taint = {d["name"]: d for d in devices_slice()["spec"]["devices"]}["gpu-1"]["taints"][0]
    assert taint["key"] == UNHEALTHY_TAINT and taint["effect"] == "NoSchedule"
    # a clean stop leaves the slices: kube-scheduler keeps seeing what it allocated
    agent.stop()
    assert sorted(s["metadata"]["name"] for s in existing_slices(api, node)) == [
        slice_name(node), slice_name(node, "counters")]


def test_prepare_writes_the_allocate_grant_as_cdi_survives_restart_and_refuses_hostile_claims(
        start_agent: Callable[[], tuple[Agent, FakeBackend]], node: str, api: SyncKubeClient,
        k8s_namespace: str, dirs: dict[str, str]) -> None:
    agent, _ = start_agent()
    share_id = str(uuid.uuid4())
    share = allocated_claim(api, k8s_namespace, "share", node, [result(
        node, "gpu-0", consumed={"compute": "30", "memory": "4Gi"}, share_id=share_id)],
        capacity={"compute": "30", "memory": "4Gi"})
    # what the API kept of kube-scheduler's answer (consumable capacity is on in 1.36)
    (kept,) = share["status"]["allocation"]["devices"]["results"]
    assert kept["consumedCapacity"] == {"compute": "30", "memory": "4Gi"}
    assert kept["shareID"] == share_id
    elsewhere = allocated_claim(api, k8s_namespace, "elsewhere", node,
                                [result("some-other-node", "gpu-0")])
    pending = allocated_claim(api, k8s_namespace, "pending", node, None)
    ghost = allocated_claim(api, k8s_namespace, "ghost", node, [result(node, "gpu-9")])

    answer = prepare(agent, ref(share), ref(elsewhere), ref(pending), ref(ghost),
                     ref(share, uid="00000000-0000-0000-0000-000000000000"))
    uid = share["metadata"]["uid"]
    ok = answer.claims[uid]
    assert ok.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids),
             d.share_id) for d in ok.devices] == [
        (["gpu"], node, "gpu-0", [f"gpu.elasticgpu.io/gpu={uid}-gpu-0"], share_id)]
    errors = {name: answer.claims[c["metadata"]["uid"]].error
              for name, c in (("elsewhere", elsewhere), ("pending", pending), ("ghost", ghost))}
    assert "allocates no device of gpu.elasticgpu.io in pool" in errors["elsewhere"]
    assert "not allocated" in errors["pending"]
    assert "'gpu-9' is not one this node publishes" in errors["ghost"]
    mismatch = answer.claims["00000000-0000-0000-0000-000000000000"].error
    assert f"has uid '{uid}'" in mismatch

    # the CDI spec gives what the device-plugin path's Allocate gives for the same share
    path = spec_file(Path(dirs["cdiDirectory"]), uid)
    spec = json.loads(path.read_text())
    assert spec["kind"] == "gpu.elasticgpu.io/gpu" and spec["cdiVersion"] == "0.6.0"
    assert isinstance(agent.mode, DraNode)
    inputs = agent.mode.plugin.inputs  # the objects the device-plugin path's Allocator holds
    allocate = build_grant([CardShare(0, f"GPU-fake-{node}-0", 300, 4096)],
                           agent.state.cards(), inputs.config, inputs.visible_env,
                           inputs.files, inputs.isolation)
    env = env_of(spec, f"{uid}-gpu-0")
    assert env == allocate.envs
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"

    # the agent restarts: the same answer from the checkpoint, nothing read or rewritten
    written = path.stat()
    agent.stop()
    again, _ = start_agent()
    assert isinstance(again.mode, DraNode)
    second = prepare(again, ref(share)).claims[uid]
    assert second == ok and again.mode.plugin.prepared_from_api == 0
    assert path.stat().st_ino == written.st_ino
    assert path.stat().st_mtime_ns == written.st_mtime_ns

    undone = unprepare(again, ref(share), ref(ghost))
    assert {k: v.error for k, v in undone.claims.items()} == {uid: "",
                                                             ghost["metadata"]["uid"]: ""}
    assert not path.exists() and again.mode.plugin.checkpoint.uids() == []
    assert unprepare(again, ref(share)).claims[uid].error == ""  # idempotent


def test_dra_mode_refuses_a_node_outside_the_dra_node_group(
        node: str, api: SyncKubeClient, dirs: dict[str, str]) -> None:
    api.patch(NODES.path(name=node), {"metadata": {"labels": {GPU_MODE_LABEL: None}}})
    agent = Agent(dra_config(dirs), FakeBackend.from_dict(INVENTORY, node), node, client=api)
    try:
        with pytest.raises(NodeModeError, match=f"Node {node} has no such label"):
            agent.start()
    finally:
        agent.stop()
    assert existing_slices(api, node) == []
    assert not registration_socket(Path(dirs["registryDirectory"])).exists()


def test_a_device_plugin_agent_refuses_a_node_of_the_dra_group(
        node: str, api: SyncKubeClient) -> None:
    """The mirror of the test above: an agent without dra.enabled on a node labelled for DRA
    publishes nothing (no GPUDevice the extender would count beside the slices)."""
    config = parse_config({"syncSeconds": 3600, "usage": {"enabled": False}})
    agent = Agent(config, FakeBackend.from_dict(INVENTORY, node), node, client=api)
    try:
        with pytest.raises(NodeModeError, match=f"Node {node} has {GPU_MODE_LABEL}=dra"):
            agent.start()
    finally:
        agent.stop()
    gpudevices, _ = api.list(GPUDEVICES.path(), {"labelSelector": f"elasticgpu.io/node={node}"})
    assert gpudevices == []


def test_prepare_refuses_a_claim_that_puts_a_card_over_capacity_with_an_event_on_its_pod(
        start_agent: Callable[[], tuple[Agent, FakeBackend]], node: str, api: SyncKubeClient,
        k8s_namespace: str, dirs: dict[str, str]) -> None:
    """Issue 41: kube-scheduler (a tenant ungated her pod) or another allocator gave card 0 to
    a second claim while a whole-card claim holds it. The node is the last word: that claim
    is refused in its own answer (the other claims of the call are prepared), nothing is
    written for it, and its pod gets a Warning Event saying why."""
    agent, _ = start_agent()
    whole = allocated_claim(api, k8s_namespace, "whole", node, [result(node, "gpu-0")])
    assert prepare(agent, ref(whole)).claims[whole["metadata"]["uid"]].error == ""
    twice = allocated_claim(api, k8s_namespace, "twice", node, [result(
        node, "gpu-0", consumed={"compute": "30", "memory": "4Gi"}, share_id=str(uuid.uuid4()))],
        capacity={"compute": "30", "memory": "4Gi"})
    beside = allocated_claim(api, k8s_namespace, "beside", node, [result(
        node, "gpu-1", consumed={"compute": "30", "memory": "4Gi"}, share_id=str(uuid.uuid4()))],
        capacity={"compute": "30", "memory": "4Gi"})
    answer = prepare(agent, ref(twice), ref(beside))
    uid = twice["metadata"]["uid"]
    error = answer.claims[uid].error
    assert error.startswith(f"ResourceClaim {k8s_namespace}/twice (uid {uid}): refused, it would "
                            "put a device over capacity: device gpu-0 would hold compute 130 % "
                            f"of 100 % and memory 45056 of 40960 MiB with the claims prepared "
                            f"on this node ({k8s_namespace}/whole: 100 %, 40960 MiB)")
    assert answer.claims[beside["metadata"]["uid"]].error == ""
    assert not spec_file(Path(dirs["cdiDirectory"]), uid).exists()
    assert isinstance(agent.mode, DraNode)
    assert uid not in agent.mode.plugin.checkpoint.uids()
    # the independent reading of the checkpoint file finds no card prepared past capacity
    checkpoint = json.loads((Path(dirs["pluginDirectory"]) / "checkpoint.json").read_text())
    cards = Node(node, 0, 0, tuple(lc.card for lc in agent.state.cards().values()))
    assert prepared_over_capacity({node: checkpoint}, [cards]) == []
    checkpoint["claims"]["fake"] = {"namespace": "x", "name": "y", "devices": [
        {"pool": node, "device": "gpu-0", "share": {"index": 0, "milli": 1, "memoryMiB": 1}}]}
    assert prepared_over_capacity({node: checkpoint}, [cards])  # it would see one

    def event() -> list[dict[str, Any]]:
        items, _ = api.list(EVENTS.path(k8s_namespace))
        return [e for e in items if e["involvedObject"].get("name") == "twice-user"
                and e["reason"] == OVER_CAPACITY]
    wait_for(lambda: bool(event()))
    (found,) = event()
    assert found["type"] == "Warning" and found["message"] == error
    assert found["involvedObject"]["uid"] == api.get(
        PODS.path(namespace=k8s_namespace, name="twice-user"))["metadata"]["uid"]
    # the whole card's pod goes (kubelet unprepares its claim): the second is prepared now
    assert unprepare(agent, ref(whole)).claims[whole["metadata"]["uid"]].error == ""
    assert prepare(agent, ref(twice)).claims[uid].error == ""
