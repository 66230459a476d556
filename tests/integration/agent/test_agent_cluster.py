"""The agent against a real API server: inventory objects, node capacity, Allocate by the
scheduler's assignment, health and allocation columns, the deployed RBAC. kubelet's side is
the protocol double.

The agent's node here is a plain Node object, not a kwok one: kwok plays kubelet and would
mark the test's pods Running at once, where a real kubelet calls Allocate while the pod is
still Pending (and the agent relies on that). The CRD is applied from deploy/crds with
kubectl, as an installer does; the agent does not create it."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from lightkube import codecs
from lightkube.resources.core_v1 import Node as K8sNode
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from egpu_testing.gpudevice_kind import GPUDevice
from egpu_testing.kubelet import KubeletDouble
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.inventory_api import list_gpudevices
from elastic_gpu.agent.deviceplugin.publish import publish_node
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Health
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

CORE = "elasticgpu.io/gpu-core"
GPU = "nvidia.com/gpu"
INVENTORY: dict[str, Any] = {
    "cards": [{"model": "A100", "memoryMiB": 40960}, {"model": "A100", "memoryMiB": 40960},
              {"model": "A100", "memoryMiB": 40960,
               "mig": [{"profile": "3g.20gb", "uuid": "MIG-q", "start": 0}]}],
}


ROOT = Path(__file__).resolve().parents[3]


def install_crd(k8s_cluster: Any) -> None:
    """`kubectl apply -f deploy/crds/gpudevices.yaml`, then wait until it is served."""
    k8s_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds" / "gpudevices.yaml"))
    k8s_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/gpudevices.elasticgpu.io")
    deadline = time.monotonic() + 30
    while k8s_cluster.kubectl("get", "gpudevices", check=False).returncode != 0:
        assert time.monotonic() < deadline, "GPUDevice CRD not served"
        time.sleep(0.1)


@pytest.fixture
def node(k8s_cluster: Any) -> Iterator[str]:
    from egpu_testing.pytest_plugin import unique_name
    from elastic_gpu.devcluster.nodes import unregister_fake_node

    install_crd(k8s_cluster)
    client = k8s_cluster.client()
    name = unique_name("agent")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "250"}
    create(client, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                    "status": {"capacity": resources, "allocatable": resources}})
    yield name
    unregister_fake_node(k8s_cluster.kube(), name)  # its pods, GPUDevices and the Node


@pytest.fixture
def api(k8s_cluster: Any) -> Iterator[SyncKubeClient]:
    """The client the agent's code takes (admin credentials, as `k8s_cluster.client()`)."""
    with SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig),
                                    field_manager="egpu-dev") as client:
        yield client


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="egpu-it-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletDouble]:
    double = KubeletDouble(plugin_dir)
    double.start()
    yield double
    double.stop()


@pytest.fixture
def agent(node: str, api: SyncKubeClient, plugin_dir: Path,
          kubelet: KubeletDouble) -> Iterator[tuple[Agent, FakeBackend]]:
    backend = FakeBackend.from_dict(INVENTORY, node)
    config = parse_config({"migStrategy": "mixed", "healthCheck": {"pollSeconds": 0.05},
                           "syncSeconds": 3600})
    running = Agent(config, backend, node, client=api, plugin_dir=plugin_dir)
    running.start()
    assert kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(GPU))
    yield running, backend
    running.stop()


def gpu_pod(namespace: str, name: str, node: str, resource: str, count: int,
            shares: list[CardShare]) -> dict[str, Any]:
    assignment = Assignment(node, {"main": tuple(shares)}).to_json()
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {ann.ASSIGNMENT: assignment,
                                         ann.ASSIGNED_NODE: node}},
            "spec": {"nodeName": node, "containers": [{
                "name": "main", "image": "registry.example/cuda:12",
                "resources": {"limits": {resource: str(count)}}}]}}


def create(client: Any, manifest: dict[str, Any]) -> None:
    client.create(codecs.from_dict(manifest))


def test_publish_node_makes_gpudevices_and_node_capacity(node: str, k8s_cluster: Any,
                                                         api: SyncKubeClient) -> None:
    client = k8s_cluster.client()
    config = parse_config({"migStrategy": "mixed"})
    publish_node(api, FakeBackend.from_dict(INVENTORY, node), config, node)
    table = k8s_cluster.kubectl("get", "gpudevices", "-l", f"elasticgpu.io/node={node}").stdout
    header, *rows = table.strip().splitlines()
    assert header.split()[:6] == ["NAME", "NODE", "INDEX", "MODEL", "MEMORY", "HEALTH"]
    assert "ALLOCATED%" in header and len(rows) == 3
    assert rows[0].split()[:7] == [f"{node}-gpu0", node, "0", "A100", "40960", "Healthy", "0"]
    short = k8s_cluster.kubectl("get", "gpud", f"{node}-gpu2", "-o", "jsonpath={.spec.mig[0].uuid}")
    assert short.stdout == "MIG-q"
    # read back as the scheduler's watch-fed view reads them: core Nodes from both lists
    nodes = gd.nodes_from_objects(list_gpudevices(api), api.list(NODES.path())[0])
    (mine,) = [n for n in nodes if n.name == node]
    assert [c.uuid for c in mine.cards] == [f"GPU-fake-{node}-{i}" for i in range(3)]
    assert mine.cards[2].mig[0].profile.name == "3g.20gb" and mine.cpu_milli > 0
    status = client.get(K8sNode, node).status
    assert status.capacity[GPU] == "2" and status.capacity[CORE] == "200"
    assert status.capacity["nvidia.com/mig-3g.20gb"] == "1"
    assert status.capacity["elasticgpu.io/gpu-memory"] == "81920"
    assert status.capacity["cpu"]  # left alone
    # the node loses a card and MIG: stale objects and resources go away
    publish_node(api, FakeBackend.from_dict({"cards": INVENTORY["cards"][:1]}, node), config, node)
    names = {d.metadata.name for d in client.list(GPUDevice, labels={"elasticgpu.io/node": node})}
    assert names == {f"{node}-gpu0"}
    status = client.get(K8sNode, node).status
    assert "nvidia.com/mig-3g.20gb" not in status.capacity and status.capacity[GPU] == "1"


def test_allocate_gives_exactly_the_assigned_cards(
        agent: tuple[Agent, FakeBackend], kubelet: KubeletDouble, node: str, k8s_cluster: Any,
        k8s_namespace: str) -> None:
    client = k8s_cluster.client()
    card1 = CardShare(1, f"GPU-fake-{node}-1", 300, 4096)
    create(client, gpu_pod(k8s_namespace, "share", node, CORE, 30, [card1]))
    # kubelet picked devices of card 0; the scheduler assigned card 1: card 1 it is
    response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(30)]])
    envs = response.container_responses[0].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{node}-1"
    assert envs["EGPU_ISOLATION"] == "accounting-only" and envs["EGPU_CORE_PERCENT"] == "30"
    # nothing is written to the pod (the agent may only read pods)
    assert ann.ALLOCATED not in client.get(Pod, "share", namespace=k8s_namespace).metadata.annotations
    # the same request again: nobody waits for it any more
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(CORE, [[f"0-{k}" for k in range(30)]])
    assert "no pod bound to" in str(err.value.details())
    # it ran and finished: its card is free again (the agent never serves a held card)
    client.patch(Pod.Status, "share", {"status": {"phase": "Succeeded"}}, namespace=k8s_namespace,
                 patch_type=PatchType.MERGE)

    whole = [CardShare(0, f"GPU-fake-{node}-0", 1000, 0), CardShare(1, f"GPU-fake-{node}-1", 1000, 0)]
    create(client, gpu_pod(k8s_namespace, "whole", node, GPU, 2, whole))
    response = kubelet.allocate(GPU, [[f"GPU-fake-{node}-1", f"GPU-fake-{node}-0"]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == \
        f"GPU-fake-{node}-0,GPU-fake-{node}-1"

    mig = [CardShare(2, f"GPU-fake-{node}-2", 0, 0, "3g.20gb", "MIG-q")]
    create(client, gpu_pod(k8s_namespace, "mig", node, "nvidia.com/mig-3g.20gb", 1, mig))
    response = kubelet.allocate("nvidia.com/mig-3g.20gb", [["MIG-q"]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-q"


def test_a_sidecar_gets_its_own_assigned_card_at_allocate(
        agent: tuple[Agent, FakeBackend], kubelet: KubeletDouble, node: str, k8s_cluster: Any,
        k8s_namespace: str) -> None:
    """kubelet calls Allocate for a sidecar (an init container with restartPolicy: Always,
    as kube-apiserver stores it) before the containers; each gets its own assigned card."""
    shares = {"proxy": (CardShare(0, f"GPU-fake-{node}-0", 200, 0),),
              "main": (CardShare(1, f"GPU-fake-{node}-1", 300, 0),)}
    pod = gpu_pod(k8s_namespace, "sidecar", node, CORE, 30, list(shares["main"]))
    pod["metadata"]["annotations"][ann.ASSIGNMENT] = Assignment(node, shares).to_json()
    pod["spec"]["initContainers"] = [{
        "name": "proxy", "image": "registry.example/proxy:1", "restartPolicy": "Always",
        "resources": {"limits": {CORE: "20"}}}]
    create(k8s_cluster.client(), pod)
    for count, card in ((20, 0), (30, 1)):
        response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(count)]])
        envs = response.container_responses[0].envs
        assert (envs["NVIDIA_VISIBLE_DEVICES"], envs["EGPU_CORE_PERCENT"]) == (
            f"GPU-fake-{node}-{card}", str(count))


def test_ambiguous_allocate_is_refused(agent: tuple[Agent, FakeBackend], kubelet: KubeletDouble,
                                       node: str, k8s_cluster: Any, k8s_namespace: str) -> None:
    client = k8s_cluster.client()
    create(client, gpu_pod(k8s_namespace, "a", node, CORE, 20,
                           [CardShare(0, f"GPU-fake-{node}-0", 200, 0)]))
    create(client, gpu_pod(k8s_namespace, "b", node, CORE, 20,
                           [CardShare(1, f"GPU-fake-{node}-1", 200, 0)]))
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(CORE, [[f"0-{k}" for k in range(20)]])
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "ambiguous" in str(err.value.details())

    # "a" is running (admitted before, e.g. by an earlier agent): kubelet never asks for it
    # again, so only "b" waits, and it gets its own card
    client.patch(Pod.Status, "a", {"status": {"phase": "Running"}}, namespace=k8s_namespace,
                 patch_type=PatchType.MERGE)
    response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(20)]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{node}-1"


def test_allocate_with_many_running_pods_reads_only_pending_ones(
        agent: tuple[Agent, FakeBackend], kubelet: KubeletDouble, node: str, k8s_cluster: Any,
        k8s_namespace: str) -> None:
    """The pods kubelet admits are Pending; 60 running pods with unserved assignments (left by
    an agent that restarted) neither slow Allocate nor confuse it."""
    client = k8s_cluster.client()
    for i in range(60):
        create(client, gpu_pod(k8s_namespace, f"run-{i}", node, CORE, 1,
                               [CardShare(i % 2, f"GPU-fake-{node}-{i % 2}", 10, 0)]))
        client.patch(Pod.Status, f"run-{i}", {"status": {"phase": "Running"}},
                     namespace=k8s_namespace, patch_type=PatchType.MERGE)
    create(client, gpu_pod(k8s_namespace, "new", node, CORE, 5,
                           [CardShare(1, f"GPU-fake-{node}-1", 50, 0)]))
    response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(5)]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{node}-1"
    running, _ = agent
    assert running.pod_cache is not None and running.pod_cache.wait_synced(10)
    # the watch cache sees all 61 (for the columns), Allocate listed only the pending one
    deadline = time.monotonic() + 10
    while len(running.pod_cache.pods()) < 61 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(running.pod_cache.pods()) == 61


def test_health_and_allocation_reach_the_inventory(
        agent: tuple[Agent, FakeBackend], node: str, k8s_cluster: Any, k8s_namespace: str) -> None:
    running, backend = agent
    client = k8s_cluster.client()
    backend.set_health(f"GPU-fake-{node}-1", Health.UNHEALTHY, "XID 79")

    def status(index: int) -> Any:
        return client.get(GPUDevice, f"{node}-gpu{index}").status

    def allocatable() -> str:
        return str(client.get(K8sNode, node).status.allocatable[GPU])

    # The device's status and the node's capacity are two writes: wait for both.
    deadline = time.monotonic() + 10
    while ((status(1)["health"], allocatable()) != ("Unhealthy", "1")
           and time.monotonic() < deadline):
        time.sleep(0.1)
    assert status(1)["health"] == "Unhealthy" and status(1)["reason"] == "XID 79"
    assert allocatable() == "1"
    backend.set_health(f"GPU-fake-{node}-1", Health.HEALTHY, "recovered")
    deadline = time.monotonic() + 10
    while (status(1)["health"], allocatable()) != ("Healthy", "2") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status(1)["health"] == "Healthy"
    assert allocatable() == "2"

    create(client, gpu_pod(k8s_namespace, "holder", node, CORE, 30,
                           [CardShare(0, f"GPU-fake-{node}-0", 300, 2048)]))
    # a MIG instance as the scheduler writes it: no milli, the profile's memory
    create(client, gpu_pod(k8s_namespace, "mig", node, "nvidia.com/mig-3g.20gb", 1,
                           [CardShare(2, f"GPU-fake-{node}-2", 0, 20480, "3g.20gb", "MIG-q")]))
    assert running.pod_cache is not None
    deadline = time.monotonic() + 10
    while len(running.pod_cache.pods()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    usage = running.sync_allocations()
    assert (usage[0].milli, usage[0].memory_mib) == (300, 2048)
    assert status(0)["allocatedPercent"] == 30 and status(0)["allocatedMemoryMiB"] == 2048
    assert status(0)["pods"] == [f"{k8s_namespace}/holder (main)"] and status(0)["podCount"] == 1
    # 3 of the A100's 7 slices: 42 %, not 0 %
    assert (status(2)["allocatedPercent"], status(2)["allocatedMemoryMiB"]) == (42, 20480)
    table = k8s_cluster.kubectl("get", "gpudevices", "-l", f"elasticgpu.io/node={node}").stdout
    header, *rows = table.strip().splitlines()
    assert header.split()[5:9] == ["HEALTH", "ALLOCATED%", "MEMORYUSED", "PODS"]
    assert rows[0].split()[5:8] == ["Healthy", "30", "2048"]
    assert f"{k8s_namespace}/holder (main)" in rows[0]
    assert rows[2].split()[6:8] == ["42", "20480"] and f"{k8s_namespace}/mig (main)" in rows[2]


def test_kubelet_zeroed_capacity_is_restored_by_the_sync(
        agent: tuple[Agent, FakeBackend], node: str, k8s_cluster: Any) -> None:
    from lightkube.types import PatchType

    running, _ = agent
    client = k8s_cluster.client()
    zero = {CORE: "0", "elasticgpu.io/gpu-memory": "0", GPU: "0"}
    client.patch(K8sNode.Status, node, {"status": {"capacity": zero, "allocatable": zero}},
                 patch_type=PatchType.MERGE)
    running.sync_allocations()
    status = client.get(K8sNode, node).status
    assert status.allocatable[CORE] == "200" and status.allocatable["elasticgpu.io/gpu-memory"] == "81920"


def test_sandbox_nodes_are_published_by_the_fake_backend(
        fake_gpu_nodes: Callable[..., list[str]], k8s_cluster: Any, k8s_namespace: str,
        api: SyncKubeClient) -> None:
    from elastic_gpu.agent.deviceplugin.publish import sync_fake_allocations

    client = k8s_cluster.client()
    (name,) = fake_gpu_nodes(1, gpus=2, gpu_model="T4", gpu_memory_mib=16384)
    devices = sorted(client.list(GPUDevice, labels={"elasticgpu.io/node": name}),
                     key=lambda d: d["spec"]["index"])
    assert [(d["spec"]["uuid"], d["spec"]["model"], d["status"]["health"]) for d in devices] == [
        (f"GPU-fake-{name}-0", "T4", "Healthy"), (f"GPU-fake-{name}-1", "T4", "Healthy")]
    assert devices[0].metadata.ownerReferences[0].name == name
    create(client, gpu_pod(k8s_namespace, "on-fake", name, CORE, 40,
                           [CardShare(1, f"GPU-fake-{name}-1", 400, 1024)]))
    assert sync_fake_allocations(api) >= 1
    status = client.get(GPUDevice, f"{name}-gpu1").status
    assert (status["allocatedPercent"], status["allocatedMemoryMiB"]) == (40, 1024)
    assert sync_fake_allocations(api) == 0  # nothing changed: nothing written


def test_egpu_agent_process_publishes_and_serves(
        node: str, k8s_cluster: Any, plugin_dir: Path, kubelet: KubeletDouble) -> None:
    import signal
    import subprocess
    import sys

    (plugin_dir / "inv.yaml").write_text("cards: [{model: L4, memoryMiB: 23034}]\n")
    (plugin_dir / "agent.yaml").write_text(
        f"backend: fake\nfake: {{inventory: inv.yaml}}\ndevicePluginDirectory: {plugin_dir}\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "elastic_gpu.cli.main", "agent", "--node", node,
         "--kubeconfig", str(k8s_cluster.kubeconfig), "--config", str(plugin_dir / "agent.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(CORE)) == 100, 30)
        row = k8s_cluster.kubectl("get", "gpudevices", f"{node}-gpu0", "--no-headers").stdout
        assert row.split()[1:6] == [node, "0", "L4", "23034", "Healthy"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_preferred_allocation_steers_kubelet_to_the_assigned_cards(
        agent: tuple[Agent, FakeBackend], kubelet: KubeletDouble, node: str, k8s_cluster: Any,
        k8s_namespace: str) -> None:
    client = k8s_cluster.client()
    uuids = [f"GPU-fake-{node}-{i}" for i in range(2)]
    create(client, gpu_pod(k8s_namespace, "pref", node, GPU, 1,
                           [CardShare(1, uuids[1], 1000, 0)]))
    assert kubelet.preferred(GPU, uuids, [], 1) == [uuids[1]]
    create(client, gpu_pod(k8s_namespace, "pref-share", node, CORE, 3,
                           [CardShare(0, uuids[0], 30, 0)]))
    chosen = kubelet.preferred(CORE, ["1-7", "1-8", "1-9", "0-0", "0-1", "0-2"], [], 3)
    assert chosen == ["0-0", "0-1", "0-2"]
    # nothing was marked: Allocate still serves the pod
    response = kubelet.allocate(GPU, [[uuids[1]]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuids[1]


def kubeconfig_with_token(k8s_cluster: Any, token: str) -> dict[str, Any]:
    admin = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": "c", "user": "agent"}}]}


def client_with_token(k8s_cluster: Any, token: str) -> Any:
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_dict(kubeconfig_with_token(k8s_cluster, token))
    return Client(config=config, field_manager="egpu-agent", trust_env=False)


def agent_client_with_token(k8s_cluster: Any, token: str, where: Path) -> SyncKubeClient:
    """The agent's own client (as `egpu agent --kubeconfig` makes it) with `token`."""
    path = where / "agent-kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig_with_token(k8s_cluster, token)))
    return SyncKubeClient.from_config(path, field_manager="egpu-agent")


def agent_token(k8s_cluster: Any, node: str | None) -> str:
    """A token of deploy/agent's ServiceAccount as the DaemonSet's pod gets it: bound to an
    agent pod on `node` (kube-apiserver then puts the pod's node into the token's user
    info). `node=None`: a plain token, bound to nothing."""
    args = ["create", "token", "elastic-gpu-agent", "-n", "elastic-gpu"]
    if node is not None:
        client = k8s_cluster.client()
        name = f"elastic-gpu-agent-{node}"
        create(client, {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": "elastic-gpu"},
                        "spec": {"nodeName": node, "serviceAccountName": "elastic-gpu-agent",
                                 "containers": [{"name": "agent", "image": "elastic-gpu"}]}})
        uid = client.get(Pod, name, namespace="elastic-gpu").metadata.uid
        args += ["--bound-object-kind", "Pod", "--bound-object-name", name,
                 "--bound-object-uid", uid]
    return str(k8s_cluster.kubectl(*args).stdout.strip())


def forbidden(call: Callable[[], Any]) -> str:
    from lightkube.core.exceptions import ApiError

    with pytest.raises(ApiError) as err:
        call()
    assert err.value.status.code == 403, err.value.status
    return str(err.value.status.message)


def test_deploy_rbac_is_enough_for_the_agent_and_no_more(
        node: str, k8s_cluster: Any, k8s_namespace: str, plugin_dir: Path,
        kubelet: KubeletDouble) -> None:
    """The agent works with nothing but deploy/agent/agent.yaml's ServiceAccount, ClusterRole
    and admission policy (a token of that account bound to an agent pod on the node, as the
    DaemonSet's pod has it; not the admin certificate),
    and that token cannot patch a CRD, write any pod, or write another node's objects."""
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    # deploy/agent/agent.yaml is the chart's rendering (namespace elastic-gpu); its RBAC and
    # policy only: a DaemonSet here would put pods on kwok nodes.
    k8s_cluster.kubectl("create", "namespace", "elastic-gpu", check=False)
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "agent" / "agent.yaml").read_text())
            if d and d["kind"] != "DaemonSet"]
    k8s_cluster.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))
    admin = k8s_cluster.client()
    other = f"{node}-other"
    create(admin, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}})
    create(admin, gpu_pod(k8s_namespace, "rbac", node, CORE, 10,
                          [CardShare(0, f"GPU-fake-{node}-0", 100, 0)]))
    token = agent_token(k8s_cluster, node)
    agent_client = client_with_token(k8s_cluster, token)
    foreign = {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "GPUDevice",
               "metadata": {"name": f"{other}-gpu0", "labels": {"elasticgpu.io/node": other}},
               "spec": {"node": other, "index": 0, "uuid": "GPU-x", "model": "A100",
                        "memoryMiB": 40960}}
    try:
        # the admission policy takes effect a moment after it is created
        deadline = time.monotonic() + 15
        while True:
            try:
                create(agent_client, foreign)
            except Exception as err:
                if "its own node" in str(err):
                    break
                raise
            admin.delete(GPUDevice, f"{other}-gpu0")
            assert time.monotonic() < deadline, "ValidatingAdmissionPolicy never took effect"
            time.sleep(0.2)

        agent_api = agent_client_with_token(k8s_cluster, token, plugin_dir)
        running = Agent(parse_config({"migStrategy": "mixed", "syncSeconds": 3600}),
                        FakeBackend.from_dict(INVENTORY, node), node, client=agent_api,
                        plugin_dir=plugin_dir)
        running.start()
        try:
            assert kubelet.wait_for(lambda: kubelet.registered(CORE))
            response = kubelet.allocate(CORE, [[f"1-{k}" for k in range(10)]])
            assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == \
                f"GPU-fake-{node}-0"
            assert running.pod_cache is not None and running.pod_cache.wait_synced(10)
            assert running.sync_allocations()[0].milli == 100
            assert admin.get(GPUDevice, f"{node}-gpu0").status["allocatedPercent"] == 10
        finally:
            running.stop()
            agent_api.close()

        # What it may not do. RBAC: CRDs, any pod anywhere.
        forbidden(lambda: agent_client.patch(
            CustomResourceDefinition, "gpudevices.elasticgpu.io",
            {"metadata": {"labels": {"x": "y"}}}, patch_type=PatchType.MERGE))
        forbidden(lambda: agent_client.patch(
            Pod, "rbac", {"metadata": {"labels": {"x": "y"}}}, namespace=k8s_namespace,
            patch_type=PatchType.MERGE))
        forbidden(lambda: agent_client.delete(Pod, "rbac", namespace=k8s_namespace))
        forbidden(lambda: agent_client.get(Pod, "rbac", namespace=k8s_namespace))
        # The admission policy: another node's GPUDevices and Node status.
        admin.create(codecs.from_dict(foreign))
        assert "its own node" in forbidden(lambda: agent_client.patch(
            GPUDevice.Status, f"{other}-gpu0", {"status": {"health": "Unhealthy"}},
            patch_type=PatchType.MERGE))
        assert "its own node" in forbidden(lambda: agent_client.delete(GPUDevice, f"{other}-gpu0"))
        assert "its own Node" in forbidden(lambda: agent_client.patch(
            K8sNode.Status, other, {"status": {"capacity": {CORE: "100"}}},
            patch_type=PatchType.MERGE))
        # A token not bound to a node writes nothing.
        unbound = client_with_token(k8s_cluster, agent_token(k8s_cluster, None))
        assert "not bound to a node" in forbidden(lambda: unbound.patch(
            GPUDevice.Status, f"{node}-gpu0", {"status": {"health": "Unhealthy"}},
            patch_type=PatchType.MERGE))
    finally:
        from elastic_gpu.devcluster.nodes import unregister_fake_node

        unregister_fake_node(k8s_cluster.kube(), other)


def test_elasticgpu_gpu_as_the_webhook_stores_it_gets_its_whole_card_at_allocate(
        agent: tuple[Agent, FakeBackend], kubelet: KubeletDouble, node: str, k8s_cluster: Any,
        k8s_namespace: str) -> None:
    """Issue #26, item 16: no agent advertises `elasticgpu.io/gpu`; the webhook stores
    `elasticgpu.io/gpu: 1` as `elasticgpu.io/gpu-core: 100` (`whole_cards_as_shares`, unit
    tested), which the share plugin serves: kubelet asks for 100 of its devices, the
    container gets the one card the scheduler assigned, exclusively."""
    client = k8s_cluster.client()
    card = CardShare(1, f"GPU-fake-{node}-1", 1000, 40960)
    create(client, gpu_pod(k8s_namespace, "elastic-whole", node, CORE, 100, [card]))
    response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(100)]])
    envs = response.container_responses[0].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{node}-1"
    assert envs["EGPU_ISOLATION"] == "exclusive" and "EGPU_CORE_PERCENT" not in envs


def test_a_share_on_two_cards_gets_each_cards_limits_at_allocate(
        node: str, api: SyncKubeClient, plugin_dir: Path, kubelet: KubeletDouble,
        k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> None:
    """Issue 40: a multi-card share (`elasticgpu.io/gpu: 2` beside `gpu-core: 30`, as the
    webhook stores it) is served by the share plugin's Allocate over gRPC: kubelet asks 30
    devices of gpu-core, the container gets both assigned cards, and with HAMi-core each
    card's memory and compute limits."""
    library = tmp_path / "libvgpu.so"
    library.write_bytes(b"\x7fELF stand-in")
    config = parse_config({"syncSeconds": 3600, "sharing": {"mode": "hami-core", "hamiCore": {
        "library": str(library), "cacheDirectory": str(tmp_path / "containers"),
        "lockDirectory": str(tmp_path / "locks")}}})
    running = Agent(config, FakeBackend.from_dict(INVENTORY, node), node, client=api,
                    plugin_dir=plugin_dir)
    running.start()
    try:
        assert kubelet.wait_for(lambda: kubelet.registered(CORE))
        shares = [CardShare(0, f"GPU-fake-{node}-0", 300, 8192),
                  CardShare(1, f"GPU-fake-{node}-1", 300, 8192)]
        manifest = gpu_pod(k8s_namespace, "two-cards", node, CORE, 30, shares)
        manifest["spec"]["containers"][0]["resources"]["limits"].update(
            {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-memory": "8192"})
        create(k8s_cluster.client(), manifest)
        response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(30)]])
        envs = response.container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{node}-0,GPU-fake-{node}-1"
        assert envs["EGPU_ISOLATION"] == "hami-core"
        assert (envs["EGPU_CORE_PERCENT"], envs["EGPU_MEMORY_MIB"]) == ("30,30", "8192,8192")
        assert {k: v for k, v in envs.items() if k.startswith("CUDA_DEVICE_") and "CACHE" not in k
                } == {"CUDA_DEVICE_MEMORY_LIMIT_0": "8192m", "CUDA_DEVICE_MEMORY_LIMIT_1": "8192m",
                      "CUDA_DEVICE_SM_LIMIT": "30", "CUDA_DEVICE_SM_LIMIT_0": "30",
                      "CUDA_DEVICE_SM_LIMIT_1": "30"}
    finally:
        running.stop()
