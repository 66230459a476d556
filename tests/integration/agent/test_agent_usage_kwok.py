"""Observed usage on kwok nodes (the sandbox's, where no agent runs): the sandbox's sync samples
the fake usage model of each kwok node with the agent's own loop: holders from their pods'
annotations, out-of-band memory from the Node's annotation; written within the write period,
out-of-band memory at once, an Event for a container above its share. Nodes kwok does not play
are left to their agent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION
from elastic_gpu.agent.config import UsageConfig
from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
from elastic_gpu.agent.usage.fake_sync import FakeUsageSync
from elastic_gpu.agent.usage.monitor import OVER_SHARE
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node
from elastic_gpu.devcluster.nodes import register_fake_node, unregister_fake_node
from elastic_gpu.kube.resources import GPUDEVICES, NODES, PODS
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration


@pytest.fixture
def api(k8s_cluster: Any) -> Iterator[SyncKubeClient]:
    with SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig),
                                    field_manager="egpu-sandbox") as client:
        yield client


@pytest.fixture
def kwok_node(k8s_cluster: Any, api: SyncKubeClient) -> Iterator[str]:
    from egpu_testing.pytest_plugin import unique_name

    ensure_crd(api)
    name = unique_name("kwok-use")
    register_fake_node(api, Node(name, 16000, 65536, tuple(
        Card(i, f"GPU-{name}-{i}", "A100", 40960) for i in range(2))))
    yield name
    unregister_fake_node(k8s_cluster.kube(), name)


def bound_pod(namespace: str, name: str, node: str, shares: list[CardShare], mib: int,
              sm: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": {
                ann.ASSIGNMENT: Assignment(node, {"main": tuple(shares)}).to_json(),
                ann.ASSIGNED_NODE: node,
                USAGE_ANNOTATION: json.dumps({"main": {"memoryMiB": mib, "smPercent": sm}})}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]}}


def test_kwok_nodes_get_observed_usage_from_the_fake_model(
        kwok_node: str, api: SyncKubeClient, k8s_cluster: Any, k8s_namespace: str) -> None:
    node = kwok_node
    api.create(PODS.path(k8s_namespace), bound_pod(
        k8s_namespace, "small", node, [CardShare(0, f"GPU-{node}-0", 300, 8192)], 2000, 20))
    api.create(PODS.path(k8s_namespace), bound_pod(
        k8s_namespace, "big", node, [CardShare(0, f"GPU-{node}-0", 300, 4096)], 6000, 50))
    sync = FakeUsageSync(api, UsageConfig(writeSeconds=3600))
    try:
        assert sync.sync() >= 2  # the first sample writes every card of the node

        def usage(index: int) -> Any:
            return api.get(GPUDEVICES.path(name=f"{node}-gpu{index}"))["status"]["usage"]

        assert (usage(0)["usedMemoryMiB"], usage(0)["smUtilizationPercent"]) == (8000, 70)
        assert [(c["pod"], c["usedMemoryMiB"]) for c in usage(0)["containers"]] == [
            ("big", 6000), ("small", 2000)]
        # Within the period nothing more is written...
        assert sync.sync() == 0
        # ...but memory on card 1 that no pod accounts for is, at once.
        api.patch(NODES.path(name=node), {"metadata": {"annotations": {
            USAGE_ANNOTATION: json.dumps({"1": {"outOfBandMiB": 30720, "smPercent": 60}})}}})
        assert sync.sync() == 1
        assert (usage(1)["outOfBandMemoryMiB"], usage(1)["usedMemoryMiB"]) == (30720, 30720)
        # The container above its share: one Event.
        deadline = time.monotonic() + 10
        while True:
            events, _ = api.list(f"/api/v1/namespaces/{k8s_namespace}/events",
                                 {"fieldSelector": f"reason={OVER_SHARE}"})
            if events:
                break
            assert time.monotonic() < deadline, "no GPUMemoryOverShare Event"
            time.sleep(0.1)
        assert [e["involvedObject"]["name"] for e in events] == ["big"]
        assert "its share is 4096 MiB" in events[0]["message"]
    finally:
        sync.close()
