"""Held metrics of a multi-card share (issue 40): one container's share on each of two cards is
counted on each card, by the extender (from its ledger) and by the agent (from the pod's
assignment), and per container once per card."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from egpu_testing.workbench import ServedExtender, metric_value, pod_manifest, ready_state
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.extender import Extender

NODE = "n0"
LIMITS = {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-core": "30",
          "elasticgpu.io/gpu-memory": "4096"}


def card(index: int, uuid: str, model: str, prefix: str) -> str:
    return (f'{prefix}device_index="{index}",device_uuid="{uuid}",model="{model}",'
            f'node="{NODE}"')


def held(text: str, component: str, labels: str) -> tuple[float | None, float | None]:
    return (metric_value(text, f"elasticgpu_{component}_card_compute_allocated_millicards"
                               f"{{{labels}}}"),
            metric_value(text, f"elasticgpu_{component}_card_memory_allocated_bytes{{{labels}}}"))


def test_the_extender_counts_each_cards_share() -> None:
    cards = tuple(Card(c, f"GPU-{c}", "A100", 40960) for c in range(3))
    state = ready_state([Node(NODE, 64_000, 256_000, cards)])
    pod = pod_manifest("multi", uid="uid-multi", limits=LIMITS)
    token, assignment = state.reserve(pod_request_from_manifest(pod), "uid-multi", NODE)
    state.settle("uid-multi", token, "bound", with_binding(pod, NODE, assignment))
    (shares,) = assignment.containers.values()
    assert len({s.index for s in shares}) == 2
    server = ServedExtender(Extender(state))
    try:
        status, text = server.get("/metrics")
    finally:
        server.stop()
    assert status == 200
    for c in cards:
        expected = (300, 4096 << 20) if c.index in {s.index for s in shares} else (0, 0)
        assert held(text, "scheduler", card(c.index, c.uuid, "A100", "")) == expected, c
        mine = (f'namespace="default",pod="multi",container="main",node="{NODE}",'
                f'device_index="{c.index}"')
        got = metric_value(text, "elasticgpu_scheduler_container_compute_allocated_millicards"
                                 f"{{{mine}}}")
        assert got == (300 if c.index in {s.index for s in shares} else None), c


class Pods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    def on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.on_node(node)


def test_the_agent_counts_each_cards_share(plugin_dir: Path) -> None:
    backend = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}] * 3},
                                    NODE)
    state = ready_state([Node(NODE, 64_000, 256_000, tuple(
        Card(c.index, c.uuid, c.model, c.memory_mib) for c in backend.discover()))])
    pod = pod_manifest("multi", uid="uid-multi", limits=LIMITS)
    _, assignment = state.reserve(pod_request_from_manifest(pod), "uid-multi", NODE)
    (shares,) = assignment.containers.values()
    bound = {"metadata": {"name": "multi", "namespace": "team-a", "uid": "uid-multi",
                          "annotations": {ann.ASSIGNMENT: assignment.to_json(),
                                          ann.ASSIGNED_NODE: NODE}},
             "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
             "status": {"phase": "Running"}}
    assert Assignment.from_json(bound["metadata"]["annotations"][ann.ASSIGNMENT]) == assignment
    agent = Agent(parse_config({"healthCheck": {"enabled": False}}), backend, NODE,
                  pods=Pods([bound]), plugin_dir=plugin_dir)
    try:
        port = agent.serve_metrics("127.0.0.1", 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        agent.stop()
    indexes = {s.index for s in shares}
    for c in backend.discover():
        expected = (300, 4096 << 20) if c.index in indexes else (0, 0)
        assert held(text, "agent", card(c.index, c.uuid, c.model, "")) == expected, c
        mine = f'namespace="team-a",pod="multi",container="main",device_index="{c.index}"'
        got = metric_value(text, "elasticgpu_agent_container_compute_allocated_millicards"
                                 f"{{{mine}}}")
        assert got == (300 if c.index in indexes else None), c
