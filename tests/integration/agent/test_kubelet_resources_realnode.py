"""The agent and a real kubelet (containerd, runc, busybox) on what kubelet accounts (issue 28).

The node has three cards of two models (A100s, 312 TFLOPS, and an H100 SXM, 989); its agent
runs the fake backend; the extender places pods behind the real kube-scheduler.

- **TFLOPS pods.** The agent advertises `elasticgpu.io/gpu-tflops` through a device plugin (one
  device per TFLOPS of each card), so kubelet admits the pods and calls Allocate, which gives
  each container the card and the share the extender computed for that card's model: 900
  TFLOPS fit only the H100 (911 milli of it); then 100 TFLOPS no longer fit what is left of it
  (89 milli, 88 TFLOPS): an A100, 321.
- **The kubelet's PodResources API.** The real kubelet's `List` (its pod-resources socket) names
  each container's devices of our plugins; the agent's reading of them names the cards the
  assignments gave, and the cross-check against the containers' real processes (mapped by their
  cgroups) finds nothing amiss.

Each container prints its environment; the test reads it from the pod's log. Skipped where the
machine cannot run a real node (the `real_node` fixture says why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.scenario import wait_extender_cards
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import build_plans, logical_cards
from elastic_gpu.agent.podresources import kubelet_cards, list_devices
from elastic_gpu.agent.usage.monitor import UsageMonitor, UsageSinks
from elastic_gpu.api.config.strict_yaml import dump_yaml
from elastic_gpu.core.assignment import pod_assignment
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.resources import GPU_TFLOPS
from elastic_gpu.core.tflops import share_milli
from elastic_gpu.core.usage import ContainerRef
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.process import ProcessHandle, spawn
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode
from elastic_gpu.devcluster.realnode_agent import agent_argv, write_agent_files

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
CORE = "elasticgpu.io/gpu-core"
MEMORY = "elasticgpu.io/gpu-memory"
A100 = "A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
INVENTORY: dict[str, Any] = {"cards": [
    {"model": A100, "memoryMiB": 81920, "uuid": "GPU-rn-a100-0"},
    {"model": H100, "memoryMiB": 81920, "uuid": "GPU-rn-h100"},
    {"model": A100, "memoryMiB": 81920, "uuid": "GPU-rn-a100-1"}]}
MODEL_OF = {card["uuid"]: card["model"] for card in INVENTORY["cards"]}
#: 2 x 312 + 989
TFLOPS_ON_NODE = "1613"


def write_inventory(path: Path) -> Path:
    path.write_text(dump_yaml(INVENTORY))
    return path


def wait_for(check: Callable[[], bool], what: str, agent: ProcessHandle,
             timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert agent.alive(), f"the agent died:\n{agent.log_tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s; agent log:\n" \
            f"{agent.log_tail()}"
        time.sleep(0.2)


def tflops_pod(name: str, scheduler: str, image: str, tflops: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "tolerations": [REAL_NODE_TOLERATION],
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": image,
                                     "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env; echo done; exec sleep 3600"],
                                     "resources": {"limits": {GPU_TFLOPS: str(tflops)}}}]}}


def pod_json(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(plane.kubectl("get", "pod", name, "-n", namespace, "-o",
                                                   "json").stdout)
    return obj


def run_and_read_env(plane: ControlPlane, namespace: str, manifest: dict[str, Any],
                     agent: ProcessHandle) -> tuple[dict[str, str], dict[str, Any]]:
    """Create the pod, wait for its container's output; its environment and the pod."""
    name = manifest["metadata"]["name"]
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    deadline = time.monotonic() + 90
    logs = ""
    while "done" not in logs.splitlines():
        obj = pod_json(plane, namespace, name)
        assert obj["status"].get("phase") not in ("Failed", "Succeeded"), obj["status"]
        assert time.monotonic() < deadline, f"no output: {obj['status']}; log: {logs!r}; " \
            f"agent log:\n{agent.log_tail()}"
        if obj["status"].get("phase") == "Running":
            logs = plane.kubectl("logs", name, "-n", namespace).stdout
        time.sleep(0.3)
    env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    return env, pod_json(plane, namespace, name)


@dataclass
class AgentNode:
    node: RealNode
    agent: ProcessHandle
    extender: ExtenderProcess


@pytest.fixture
def agent_node(real_node: RealNode, k8s_cluster: ControlPlane,
               start_kube_scheduler: Callable[..., Any], tmp_path: Path
               ) -> Iterator[AgentNode]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    plane = k8s_cluster
    ensure_crd(plane.kube())
    config = write_agent_files(tmp_path / "agent", real_node.device_plugin_dir, INVENTORY,
                               {"syncSeconds": 1})
    agent = spawn("agent", agent_argv(real_node.name, plane.kubeconfig, config),
                  tmp_path / "agent.log", die_with_parent=True)
    (port,) = free_ports(1)
    extender = ExtenderProcess(plane.kubeconfig, port, tmp_path / "extender.log")
    try:
        extender.start()
        start_kube_scheduler(extender_kube_scheduler_config(extender.url,
                                                            extender.scheduler_name))
        wait_for(lambda: f"registered {GPU_TFLOPS} with kubelet" in agent.log_path.read_text(),
                 "registration of the TFLOPS plugin", agent)

        # kubelet counts the plugin's devices: one per TFLOPS of each card.
        def kubelet_counts() -> bool:
            node = json.loads(plane.kubectl("get", "node", real_node.name, "-o", "json").stdout)
            return bool(node["status"].get("allocatable", {}).get(GPU_TFLOPS) == TFLOPS_ON_NODE)
        wait_for(kubelet_counts, f"{TFLOPS_ON_NODE} TFLOPS allocatable on the Node", agent)
        # The extender holds the node's very cards (a wrong or missing H100 would refuse the
        # 900-TFLOPS pod at the A100's 312): waited for by uuid and model, not by count.
        wait_extender_cards(extender.url, real_node.name, MODEL_OF)
        yield AgentNode(real_node, agent, extender)
    finally:
        extender.stop()
        agent.stop()


def test_tflops_pods_get_the_share_of_their_cards_model_through_kubelet(
        agent_node: AgentNode, k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    plane, agent, extender, real_node = (k8s_cluster, agent_node.agent, agent_node.extender,
                                         agent_node.node)
    seen: dict[str, tuple[str, int]] = {}
    for name, tflops, model in (("big", 900, H100), ("small", 100, A100)):
        env, pod = run_and_read_env(plane, k8s_namespace, tflops_pod(
            name, extender.scheduler_name, real_node.busybox_image, tflops), agent)
        assignment = pod_assignment(pod)
        assert assignment is not None
        (share,) = assignment.containers["main"]
        milli = share_milli(model, tflops)
        assert milli is not None
        # The extender sized the share for this card's model ...
        assert (MODEL_OF[share.uuid], share.milli) == (model, milli)
        # ... and kubelet's Allocate gave the container exactly that card and share.
        assert env["NVIDIA_VISIBLE_DEVICES"] == share.uuid
        assert env["EGPU_CARDS"] == str(share.index)
        assert env["EGPU_CORE_PERCENT"] == str(milli // 10)
        assert env["EGPU_ISOLATION"] == "accounting-only"
        seen[name] = (MODEL_OF[share.uuid], share.milli)
    assert seen == {"big": (H100, 911), "small": (A100, 321)}


def share_pod(name: str, scheduler: str, image: str) -> dict[str, Any]:
    manifest = tflops_pod(name, scheduler, image, 1)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {
        CORE: "30", NODE_CORE: "30", MEMORY: "4096"}}
    manifest["metadata"]["annotations"] = {USAGE_ANNOTATION: json.dumps(
        {"main": {"memoryMiB": 1000}})}
    return manifest


def whole_pod(name: str, scheduler: str, image: str) -> dict[str, Any]:
    manifest = tflops_pod(name, scheduler, image, 1)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1", NODE_CORE: "100"}}
    manifest["metadata"]["annotations"] = {USAGE_ANNOTATION: json.dumps(
        {"main": {"memoryMiB": 2000}})}
    return manifest


def test_the_kubelets_pod_resources_name_the_assigned_cards_and_agree_with_the_cgroups(
        agent_node: AgentNode, k8s_cluster: ControlPlane, k8s_namespace: str,
        tmp_path: Path) -> None:
    plane, agent, node = k8s_cluster, agent_node.agent, agent_node.node
    scheduler = agent_node.extender.scheduler_name
    pods = {}
    for manifest in (whole_pod("whole", scheduler, node.busybox_image),
                     share_pod("share", scheduler, node.busybox_image)):
        _, pods[manifest["metadata"]["name"]] = run_and_read_env(plane, k8s_namespace,
                                                                 manifest, agent)
    assigned = {}
    for name, pod in pods.items():
        assignment = pod_assignment(pod)
        assert assignment is not None
        assigned[ContainerRef(k8s_namespace, name, "main")] = {
            s.index for s in assignment.containers["main"]}

    # The real kubelet's answer, on its own socket: each container's devices of our plugins.
    socket = node.paths.kubelet_root / "pod-resources" / "kubelet.sock"
    devices = [d for d in list_devices(socket) if d.ref.namespace == k8s_namespace]
    by_ref = {(d.ref.pod, d.resource): d.device_ids for d in devices}
    whole_card = next(iter(assigned[ContainerRef(k8s_namespace, "whole", "main")]))
    assert by_ref[("whole", GPU)] == (INVENTORY["cards"][whole_card]["uuid"],)
    assert len(by_ref[("share", CORE)]) == 30  # one device per percent
    # The agent reads them as the cards the assignments gave (GetPreferredAllocation steered
    # kubelet's choice there).
    config = parse_config({"backend": "fake", "fake": {"inventory": str(
        write_inventory(tmp_path / "inventory.yaml"))}})
    assert config.fake is not None
    backend = FakeBackend.from_file(config.fake.inventory, node.name)
    cards = logical_cards(backend.discover(), False)
    plans = build_plans(cards, config)
    held: dict[ContainerRef, set[int]] = {}
    for card, refs in kubelet_cards(devices, plans).items():
        for ref in refs:
            held.setdefault(ref, set()).add(card)
    assert held == assigned

    # The sampling loop, on the containers' real processes (the fake backend reports their
    # real PIDs, which the agent maps by cgroup) and the kubelet's answer: each container is
    # seen on its card and nothing disagrees.
    namespace_pods = json.loads(plane.kubectl("get", "pods", "-n", k8s_namespace, "-o",
                                              "json").stdout)["items"]
    monitor = UsageMonitor(node.name, cards, backend, config.usage, lambda: namespace_pods,
                           UsageSinks(None, lambda *event: None, lambda p: None),
                           kubelet=lambda: list_devices(socket), plans=plans)
    view = monitor.tick()
    observed = {ContainerRef(c.namespace, c.pod, c.container): index
                for index, use in view.cards.items() for c in use.containers}
    assert observed == {ref: next(iter(cards_)) for ref, cards_ in assigned.items()}
    assert view.mismatches == []
