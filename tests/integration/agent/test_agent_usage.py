"""Observed usage against a real API server: the agent (fake backend's usage model) writes each
card's `status.usage` (the GPUDevice status subresource), holds the write period, writes at
once when out-of-band memory appears, and reports a container above its memory share with an
Event. The node is a plain Node object (as in test_agent_cluster: no kubelet runs its pods,
so the fake names each holder's process itself; the real-node test maps real PIDs)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import codecs

from egpu_testing.gpudevice_kind import GPUDevice
from egpu_testing.kubelet import KubeletDouble
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.agent.usage.monitor import OVER_SHARE
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

CARDS = [{"model": "A100", "memoryMiB": 40960} for _ in range(3)]
CORE = "elasticgpu.io/gpu-core"
ROOT = Path(__file__).resolve().parents[3]


def install_crd(k8s_cluster: Any) -> None:
    k8s_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds" / "gpudevices.yaml"))
    k8s_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/gpudevices.elasticgpu.io")
    eventually(lambda: k8s_cluster.kubectl("get", "gpudevices", check=False).returncode == 0)


def create(client: Any, manifest: dict[str, Any]) -> None:
    client.create(codecs.from_dict(manifest))


def gpu_pod(namespace: str, name: str, node: str, resource: str, count: int,
            shares: list[CardShare]) -> dict[str, Any]:
    """A pod as the scheduler leaves it: bound, with its assignment."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {ann.ASSIGNMENT: Assignment(
                             node, {"main": tuple(shares)}).to_json(),
                             ann.ASSIGNED_NODE: node}},
            "spec": {"nodeName": node, "containers": [{
                "name": "main", "image": "registry.example/cuda:12",
                "resources": {"limits": {resource: str(count)}}}]}}


def eventually(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)


@pytest.fixture
def node(k8s_cluster: Any) -> Iterator[str]:
    from egpu_testing.pytest_plugin import unique_name
    from elastic_gpu.devcluster.nodes import unregister_fake_node

    install_crd(k8s_cluster)
    name = unique_name("usage")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "250"}
    create(k8s_cluster.client(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                  "status": {"capacity": resources, "allocatable": resources}})
    yield name
    unregister_fake_node(k8s_cluster.kube(), name)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="egpu-use-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_agent(k8s_cluster: Any, node: str, workdir: Path, usage: dict[str, Any]
                ) -> tuple[Agent, Path, SyncKubeClient, KubeletDouble]:
    inventory = workdir / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"cards": CARDS}))
    kubelet = KubeletDouble(workdir)
    kubelet.start()
    api = SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig), field_manager="egpu-agent")
    config = parse_config({"healthCheck": {"enabled": False}, "syncSeconds": 3600,
                           "usage": usage})
    agent = Agent(config, FakeBackend.from_file(inventory, node), node, client=api,
                  plugin_dir=workdir)
    agent.start()
    return agent, inventory, api, kubelet


def stop_agent(agent: Agent, api: SyncKubeClient, kubelet: KubeletDouble) -> None:
    agent.stop()
    api.close()
    kubelet.stop()


def using(pod: dict[str, Any], mib: int, sm: int) -> dict[str, Any]:
    pod["metadata"]["annotations"][USAGE_ANNOTATION] = json.dumps(
        {"main": {"memoryMiB": mib, "smPercent": sm}})
    return pod


def test_usage_is_written_and_a_container_over_its_share_gets_an_event(
        node: str, k8s_cluster: Any, k8s_namespace: str, workdir: Path) -> None:
    agent, _, api, kubelet = start_agent(k8s_cluster, node, workdir, {
        "sampleSeconds": 0.5, "writeSeconds": 1})
    client = k8s_cluster.client()
    try:
        create(client, using(gpu_pod(k8s_namespace, "small", node, CORE, 30,
                                     [CardShare(0, f"GPU-fake-{node}-0", 300, 8192)]), 2000, 20))
        create(client, using(gpu_pod(k8s_namespace, "big", node, CORE, 30,
                                     [CardShare(0, f"GPU-fake-{node}-0", 300, 4096)]), 6000, 50))
        create(client, using(gpu_pod(k8s_namespace, "whole", node, "nvidia.com/gpu", 1,
                                     [CardShare(1, f"GPU-fake-{node}-1", 1000, 40960)]),
                             30000, 90))

        def usage(index: int) -> Any:
            return (client.get(GPUDevice, f"{node}-gpu{index}").status or {}).get("usage")

        card0 = eventually(lambda: (u := usage(0)) and len(u["containers"]) == 2 and u)
        assert (card0["usedMemoryMiB"], card0["outOfBandMemoryMiB"],
                card0["smUtilizationPercent"]) == (8000, 0, 70)
        assert [(c["pod"], c["usedMemoryMiB"]) for c in card0["containers"]] == [
            ("big", 6000), ("small", 2000)]
        card1 = eventually(lambda: (u := usage(1)) and u["containers"] and u)
        assert card1["usedMemoryMiB"] == 30000 and card1["smUtilizationPercent"] == 90
        table = k8s_cluster.kubectl("get", "gpudevices", "-l",
                                    f"elasticgpu.io/node={node}").stdout
        header, *rows = table.strip().splitlines()
        assert header.split()[-4:-1] == ["OBSERVED", "OUTOFBAND", "UTIL%"]
        assert rows[0].split()[-4:-1] == ["8000", "0", "70"]

        def over_events() -> list[str]:
            out = k8s_cluster.kubectl("get", "events", "-n", k8s_namespace, "--field-selector",
                                      f"reason={OVER_SHARE}", "-o", "json").stdout
            return [f"{e['involvedObject']['name']}: {e['message']}"
                    for e in json.loads(out)["items"]]

        (event,) = eventually(over_events)
        assert event.startswith("big: container main of") and "uses 6000 MiB" in event
        assert "its share is 4096 MiB" in event
        time.sleep(2)  # several samples later: still one Event (one per container per period)
        assert len(over_events()) == 1
    finally:
        stop_agent(agent, api, kubelet)


def test_the_write_period_holds_and_out_of_band_memory_is_written_at_once(
        node: str, k8s_cluster: Any, k8s_namespace: str, workdir: Path) -> None:
    agent, inventory, api, kubelet = start_agent(k8s_cluster, node, workdir, {
        "sampleSeconds": 0.5, "writeSeconds": 3600, "outOfBandThresholdMiB": 1024})
    client = k8s_cluster.client()
    try:
        # The first sample writes every card (never written before).
        eventually(lambda: all((client.get(GPUDevice, f"{node}-gpu{i}").status or {})
                               .get("usage") for i in range(3)))
        assert agent.usage is not None
        monitor = agent.usage
        # the count follows each write's answer, which can come after the API shows it
        first = eventually(lambda: monitor.writes if monitor.writes >= 3 else 0, timeout_s=10)
        assert first == 3
        # A busy container whose use moves on every sample: nothing is written within the
        # period (3600 s here), however many samples see it.
        pod = gpu_pod(k8s_namespace, "busy", node, CORE, 30,
                      [CardShare(0, f"GPU-fake-{node}-0", 300, 8192)])
        create(client, using(pod, 1000, 10))
        for step in range(10):
            k8s_cluster.kubectl("annotate", "--overwrite", "pod", "busy", "-n", k8s_namespace,
                                f"{USAGE_ANNOTATION}="
                                + json.dumps({"main": {"memoryMiB": 1000 + 700 * step,
                                                       "smPercent": 10 * step}}))
            time.sleep(0.5)
        # ...though the agent saw it (its metrics follow every sample).
        eventually(lambda: [c.memory_mib for c in agent.usage.view().cards[0].containers]
                   == [1000 + 700 * 9], timeout_s=5)
        assert agent.usage.writes == first
        assert client.get(GPUDevice, f"{node}-gpu0").status["usage"]["containers"] == []
        # Another process takes 20 GiB of card 2: written at once, the period notwithstanding.
        inventory.write_text(yaml.safe_dump({"cards": [CARDS[0], CARDS[1], {
            **CARDS[2], "usage": {"outOfBandMiB": 20480}}]}))
        os.utime(inventory, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        eventually(lambda: client.get(GPUDevice, f"{node}-gpu2").status["usage"][
            "outOfBandMemoryMiB"] == 20480, timeout_s=10)
        assert eventually(lambda: monitor.writes > first, timeout_s=10)
        time.sleep(1.5)  # three more samples: a second write would have come by now
        assert monitor.writes == first + 1
    finally:
        stop_agent(agent, api, kubelet)
