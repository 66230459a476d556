"""Pods asking `elasticgpu.io/gpu-tflops` run on a real kubelet (issue 28, TFLOPS).

A real kubelet node (containerd, runc, busybox) with two cards of two models (an A100, 312
TFLOPS, and an H100 SXM, 989), its agent on the fake backend, the extender behind the real
kube-scheduler. The agent advertises the TFLOPS resource through a device plugin (one device per
TFLOPS of each card), so kubelet admits the pods and calls Allocate, which gives each container
the card and the share the extender computed for that card's model:

- 900 TFLOPS fit only the H100: 911 milli of it;
- then 100 TFLOPS no longer fit what is left of the H100 (89 milli, 88 TFLOPS): the A100, 321.

Each container prints its environment; the test reads it from the pod's log. Skipped where the
machine cannot run a real node (the `real_node` fixture says why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.scenario import wait_extender_knows
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config
from elastic_gpu.core.assignment import pod_assignment
from elastic_gpu.core.resources import GPU_TFLOPS
from elastic_gpu.core.tflops import share_milli
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.process import ProcessHandle, spawn
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode
from elastic_gpu.devcluster.realnode_agent import agent_argv, write_agent_files

pytestmark = pytest.mark.integration

A100 = "A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
INVENTORY: dict[str, Any] = {"cards": [
    {"model": A100, "memoryMiB": 81920, "uuid": "GPU-tflops-a100"},
    {"model": H100, "memoryMiB": 81920, "uuid": "GPU-tflops-h100"}]}
UUID_OF = {card["model"]: card["uuid"] for card in INVENTORY["cards"]}


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


def test_tflops_pods_get_the_share_of_their_cards_model_through_kubelet(
        real_node: RealNode, k8s_cluster: ControlPlane, k8s_namespace: str,
        start_kube_scheduler: Callable[..., Any], tmp_path: Path) -> None:
    from elastic_gpu.agent.inventory_api import ensure_crd

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
            return bool(node["status"].get("allocatable", {}).get(GPU_TFLOPS) == "1301")
        wait_for(kubelet_counts, "1301 TFLOPS allocatable on the Node", agent)
        wait_extender_knows(extender.url, [real_node.name], len(INVENTORY["cards"]))

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
            assert (share.uuid, share.milli) == (UUID_OF[model], milli)
            # ... and kubelet's Allocate gave the container exactly that card and share.
            assert env["NVIDIA_VISIBLE_DEVICES"] == share.uuid
            assert env["EGPU_CARDS"] == str(share.index)
            assert env["EGPU_CORE_PERCENT"] == str(milli // 10)
            assert env["EGPU_ISOLATION"] == "accounting-only"
            seen[name] = (share.uuid, share.milli)
        assert seen == {"big": ("GPU-tflops-h100", 911), "small": ("GPU-tflops-a100", 321)}
    finally:
        extender.stop()
        agent.stop()
