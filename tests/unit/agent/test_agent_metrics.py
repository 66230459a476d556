"""The agent's /metrics: each card's capacity, health and holdings as the agent sees them, per
container shares, and Allocate's outcomes (docs/metrics.md)."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.workbench import metric_value
from elastic_gpu.agent.backends.base import HealthEvent
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.node import DevicePluginNode
from elastic_gpu.agent.matching import AllocateError
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Health

NODE = "n1"
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 40960} for _ in range(2)]}
CARD0 = f'device_index="0",device_uuid="GPU-fake-{NODE}-0",model="A100",node="{NODE}"'
CARD1 = f'device_index="1",device_uuid="GPU-fake-{NODE}-1",model="A100",node="{NODE}"'


class Pods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.on_node(node) if p["status"]["phase"] == "Pending"]

    def on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.on_node(node)


def plugin_mode(agent: Agent) -> DevicePluginNode:
    """The agent's node mode, which these tests run as device-plugin nodes."""
    assert isinstance(agent.mode, DevicePluginNode)
    return agent.mode


def pod(name: str, shares: dict[str, list[CardShare]], phase: str = "Running") -> dict[str, Any]:
    assignment = Assignment(NODE, {c: tuple(s) for c, s in shares.items()})
    return {"metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                         "annotations": {ann.ASSIGNMENT: assignment.to_json(),
                                         ann.ASSIGNED_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [{"name": c} for c in shares]},
            "status": {"phase": phase}}


def share(card: int, milli: int, mib: int) -> CardShare:
    return CardShare(card, f"GPU-fake-{NODE}-{card}", milli, mib)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


@pytest.fixture
def agent(plugin_dir: Path) -> Any:
    pods = Pods([pod("train", {"main": [share(0, 300, 4096)], "side": [share(0, 200, 1024)]}),
                 pod("done", {"main": [share(1, 1000, 40960)]}, phase="Succeeded")])
    running = Agent(parse_config({"healthCheck": {"enabled": False}}),
                    FakeBackend.from_dict(INVENTORY, NODE), NODE, pods=pods,
                    plugin_dir=plugin_dir)
    yield running
    running.stop()


def test_cards_show_capacity_health_and_what_pods_hold(agent: Agent) -> None:
    text = scrape(agent.serve_metrics("127.0.0.1", 0))
    for card in (CARD0, CARD1):
        assert metric_value(text, f"elasticgpu_agent_card_compute_capacity_millicards{{{card}}}"
                            ) == 1000
        assert metric_value(text, f"elasticgpu_agent_card_memory_capacity_bytes{{{card}}}"
                            ) == 40960 << 20
        assert metric_value(text, f"elasticgpu_agent_card_healthy{{{card}}}") == 1
    # both containers of the running pod on card 0; the finished pod holds nothing
    assert metric_value(text, f"elasticgpu_agent_card_compute_allocated_millicards{{{CARD0}}}"
                        ) == 500
    assert metric_value(text, f"elasticgpu_agent_card_memory_allocated_bytes{{{CARD0}}}"
                        ) == 5120 << 20
    assert metric_value(text, f"elasticgpu_agent_card_compute_allocated_millicards{{{CARD1}}}"
                        ) == 0
    side = 'namespace="team-a",pod="train",container="side",device_index="0"'
    assert metric_value(text, f"elasticgpu_agent_container_compute_allocated_millicards{{{side}}}"
                        ) == 200
    assert metric_value(text, f"elasticgpu_agent_container_memory_allocated_bytes{{{side}}}"
                        ) == 1024 << 20
    assert metric_value(text, 'elasticgpu_agent_container_compute_allocated_millicards'
                              '{pod="done"}') is None


def test_health_follows_the_backend_and_allocate_outcomes_are_counted(agent: Agent) -> None:
    port = agent.serve_metrics("127.0.0.1", 0)
    agent.state.apply([HealthEvent(f"GPU-fake-{NODE}-1", Health.UNHEALTHY, "Xid 79")])
    plan = next(p for p in agent.snapshot.plans if p.resource == "elasticgpu.io/gpu-core")
    with pytest.raises(AllocateError):
        plugin_mode(agent).allocator.allocate(plan, ["no-such-device"])
    text = scrape(port)
    assert metric_value(text, f"elasticgpu_agent_card_healthy{{{CARD1}}}") == 0
    assert metric_value(text, f"elasticgpu_agent_card_healthy{{{CARD0}}}") == 1
    assert metric_value(text, 'elasticgpu_agent_allocations_total'
                              '{resource="elasticgpu.io/gpu-core",result="refused"}') == 1
