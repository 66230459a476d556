"""The peers' pods on the real kubelet node (issue 40, must-show: "each container's environment
carries the per-card limits its isolation provider needs").

HAMi's memory-fraction example (30 % compute and 50 % memory of each of 2 cards), HAMi's sharing
example (60 % / 40 % of one card), HAMi's default example (the Deployment of `example.yaml`:
3000 MiB, no gpucores), KAI's fraction pod (half a card's memory) and Volcano's hami-core pod
(50 %, 3000 MiB) go through our webhook (which reads the peers' fields as ours),
the extender behind a real kube-scheduler answering the peers' scheduler names, and the agent's
Allocate in `sharing.mode: hami-core` on a real kubelet. Each container prints its environment
and the test reads the limits HAMi-core reads: `CUDA_DEVICE_MEMORY_LIMIT_<i>` per visible card,
`CUDA_DEVICE_SM_LIMIT` and, on several cards, `CUDA_DEVICE_SM_LIMIT_<i>`, with the visible
devices being the cards of the pod's assignment, in its order. The memory-only shares (HAMi's
example, KAI's pod) hold the 1 % compute device in the ledger, but asked no compute: HAMi-core
gets `CUDA_DEVICE_SM_LIMIT=0`, no limit, as HAMi gives a pod without `gpucores`.

The examples' resources, annotations and scheduler names are kept; only what a busybox on this
node needs changes (image, command, the real node's toleration and hostname), and HAMi's pods,
which HAMi's own webhook sends to `hami-scheduler`, name it here (a Deployment's pod is its
template, named as the Deployment).

Skipped where the machine cannot run a real node (the `real_node` fixture says why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import wait_extender_knows
from egpu_testing.webhook import running_webhook, wait_in_force
from egpu_testing.workbench import ExtenderProcess
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.schedulers import PEER_SCHEDULERS
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.process import ProcessHandle, spawn
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode
from elastic_gpu.devcluster.realnode_agent import agent_argv, write_agent_files
from elastic_gpu.scheduler.schedconfig import kube_scheduler_config

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[2] / "peerdata"
CORE = "elasticgpu.io/gpu-core"
CARD_MIB = 81920
INVENTORY: dict[str, Any] = {
    "cards": [{"model": "A100-SXM4-80GB", "memoryMiB": CARD_MIB, "uuid": f"GPU-peer-{i}"}
              for i in range(3)]}
#: (example, pod) -> (percent of each card's compute in the ledger, MiB of each card's memory);
#: HAMi's default example and KAI's pod ask memory only and are billed the 1 % compute device
#: every memory-only share gets
EXPECTED: dict[tuple[str, str], tuple[int, int]] = {
    ("hami/use_memory_fraction.yaml", "gpu-pod"): (30, CARD_MIB // 2),
    ("hami/use_sharing_card.yaml", "gpu-pod1"): (60, CARD_MIB * 40 // 100),
    ("hami/example.yaml", "cuda-sample-vector-add"): (1, 3000),
    ("kai/gpu-sharing.yaml", "gpu-sharing"): (1, CARD_MIB // 2),
    ("volcano/hami-core-pod.yaml", "hami-pod"): (50, 3000),
}
#: the memory-only shares: no compute limit in the container (HAMi-core's 0), issue 40
MEMORY_ONLY = {("hami/example.yaml", "cuda-sample-vector-add"),
               ("kai/gpu-sharing.yaml", "gpu-sharing")}
#: how many distinct cards (1 unless named)
CARDS = {("hami/use_memory_fraction.yaml", "gpu-pod"): 2}


@dataclass
class PeerNode:
    node: RealNode
    agent: ProcessHandle
    namespace: str


def example_pod(example: str, name: str, node: RealNode) -> dict[str, Any]:
    """The example's pod `name`, its GPU fields unchanged, made runnable on the real node."""
    (pod,) = [d for d in yaml.safe_load_all((DATA / example).read_text())
              if d and d["metadata"]["name"] == name]
    if pod["kind"] == "Deployment":
        # its pod, as HAMi's webhook sees it: the template, sent to hami-scheduler
        template = pod["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**template.get("metadata", {}), "name": name},
               "spec": {**template["spec"], "schedulerName": "hami-scheduler"}}
    spec = pod["spec"]
    spec.setdefault("schedulerName", "hami-scheduler")
    spec["tolerations"] = [REAL_NODE_TOLERATION]
    spec["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    spec["terminationGracePeriodSeconds"] = 0
    for container in spec["containers"]:
        container.pop("args", None)
        container.update(image=node.busybox_image, imagePullPolicy="Never",
                         command=["sh", "-c", "env; echo env-done; exec sleep 3600"])
    return dict(pod)


@pytest.fixture
def peer_node(real_node: RealNode, k8s_cluster: ControlPlane, k8s_namespace: str,
              start_kube_scheduler: Any, tmp_path: Path) -> Iterator[PeerNode]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    library = tmp_path / "vgpu" / "libvgpu.so"
    library.parent.mkdir()
    library.write_text("stand-in for libvgpu.so\n")
    config = write_agent_files(tmp_path / "agent", real_node.device_plugin_dir, INVENTORY, {
        "resources": {"share": [CORE]}, "syncSeconds": 1,
        "sharing": {"mode": "hami-core", "hamiCore": {
            "library": str(library), "cacheDirectory": str(tmp_path / "vgpu" / "containers"),
            "lockDirectory": str(tmp_path / "vgpulock")}}})
    agent = spawn("agent", agent_argv(real_node.name, k8s_cluster.kubeconfig, config),
                  tmp_path / "agent.log", die_with_parent=True)
    (port,) = free_ports(1)
    own = unique_name("egpu-peers")
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log",
                               scheduler_name=own,
                               config={"schedulerNames": [own, *PEER_SCHEDULERS]})
    try:
        extender.start()
        # the peers' scheduler names are profiles of this kube-scheduler, as the chart ships it
        sched = kube_scheduler_config(extender.url, scheduler_name=extender.scheduler_name,
                                      peer_schedulers=PEER_SCHEDULERS)
        start_kube_scheduler(sched)
        wait_extender_knows(extender.url, [real_node.name], len(INVENTORY["cards"]))
        with running_webhook(k8s_cluster, tmp_path, "peers-rn", "peers-rn") as hook:
            assert hook.label is not None
            k8s_cluster.kubectl("label", "namespace", k8s_namespace,
                                f"{hook.label[0]}={hook.label[1]}")
            wait_in_force(k8s_cluster, k8s_namespace)
            yield PeerNode(real_node, agent, k8s_namespace)
    finally:
        extender.stop()
        agent.stop()


def environment(plane: ControlPlane, namespace: str, name: str,
                agent: ProcessHandle) -> tuple[dict[str, str], dict[str, Any]]:
    deadline = time.monotonic() + 120
    logs = ""
    while "env-done" not in logs:
        pod: dict[str, Any] = json.loads(plane.kubectl("get", "pod", name, "-n", namespace,
                                                       "-o", "json").stdout)
        assert pod["status"].get("phase") not in ("Failed", "Succeeded"), pod["status"]
        assert time.monotonic() < deadline, f"{name}: no output: {pod['status']}; agent " \
            f"log:\n{agent.log_tail()}"
        if pod["status"].get("phase") == "Running":
            logs = plane.kubectl("logs", name, "-n", namespace).stdout
        time.sleep(0.3)
    env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    return env, pod


def test_peers_pods_get_hami_core_limits_per_card(peer_node: PeerNode,
                                                  k8s_cluster: ControlPlane) -> None:
    plane, ns = k8s_cluster, peer_node.namespace
    for example, name in EXPECTED:
        created = plane.kubectl("create", "-n", ns, "-f", "-", check=False, input=json.dumps(
            example_pod(example, name, peer_node.node)))
        assert created.returncode == 0, f"{example}: {created.stderr}"
    for (example, name), (percent, mib) in EXPECTED.items():
        env, pod = environment(plane, ns, name, peer_node.agent)
        assignment = Assignment.from_json(pod["metadata"]["annotations"][ann.ASSIGNMENT])
        (shares,) = assignment.containers.values()
        cards = CARDS.get((example, name), 1)
        # the peer's meaning, in the ledger: N shares of that shape on N distinct cards
        assert len({s.uuid for s in shares}) == len(shares) == cards, example
        assert {(s.milli, s.memory_mib) for s in shares} == {(percent * 10, mib)}, example
        # ... and in the container: the cards it sees are its assignment's, in order
        visible = [v for k, v in env.items() if k.endswith("VISIBLE_DEVICES")]
        assert visible and all(v == ",".join(s.uuid for s in shares) for v in visible), env
        assert env["EGPU_ISOLATION"] == "hami-core", example
        for i in range(cards):
            assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{mib}m", (example, env)
        assert f"CUDA_DEVICE_MEMORY_LIMIT_{cards}" not in env, example
        # the limit follows what the container asked: a memory-only share asked no compute
        # (HAMi-core's 0, no limit) though the ledger bills it 1 %
        sm = "0" if (example, name) in MEMORY_ONLY else str(percent)
        assert env["CUDA_DEVICE_SM_LIMIT"] == sm, example
        per_card = {k: v for k, v in env.items() if k.startswith("CUDA_DEVICE_SM_LIMIT_")}
        assert per_card == ({f"CUDA_DEVICE_SM_LIMIT_{i}": sm for i in range(cards)}
                            if cards > 1 else {}), example
