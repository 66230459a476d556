"""Allocate over a pod source: what it reads, what it remembers, and that it never guesses.

The source here is an in-memory stand-in for the API (the same dicts the API returns);
tests/integration/agent runs the same paths against a real kube-apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.backends.isolation import cuda_mps_isolation
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.deviceplugin.inventory_api import InventoryApiError
from elastic_gpu.agent.devices import build_plans, logical_cards
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.agent.matching import AllocateError
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare

CORE = "elasticgpu.io/gpu-core"
NODE = "n1"
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 40960} for _ in range(2)]}


class Pods:
    """Pods on the node, with kubelet's phases; counts what Allocate reads."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.pending_reads = 0
        self.cache_reads = 0

    def add(self, name: str, card: int, phase: str = "Pending", core: int = 10) -> None:
        share = CardShare(card, f"GPU-fake-{NODE}-{card}", core * 10, 0)
        self.pods.append({
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-01-01T00:00:{len(self.pods):02d}Z",
                         "annotations": {ann.ASSIGNMENT: Assignment(NODE, {"main": (share,)})
                                         .to_json(), ann.ASSIGNED_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "resources": {"limits": {CORE: str(core)}}}]},
            "status": {"phase": phase}})

    def set_phase(self, name: str, phase: str) -> None:
        (pod,) = [p for p in self.pods if p["metadata"]["name"] == name]
        pod["status"]["phase"] = phase

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        self.pending_reads += 1
        return [p for p in self.pods if p["spec"]["nodeName"] == node
                and p["status"]["phase"] == "Pending"]

    def on_node(self, node: str) -> list[dict[str, Any]]:
        self.cache_reads += 1
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node
                and p["status"]["phase"] not in ("Succeeded", "Failed")]


def allocator(pods: Pods) -> tuple[Allocator, Any]:
    config = parse_config({"healthCheck": {"enabled": False}})
    backend = FakeBackend.from_dict(INVENTORY, NODE)
    cards = logical_cards(backend.discover(), config.splitBoard)
    (plan,) = [p for p in build_plans(cards, config) if p.resource == CORE]
    return Allocator(NODE, config, NodeState(cards), "NVIDIA_VISIBLE_DEVICES",
                     DeviceFiles({}, ()),
                     cuda_mps_isolation(config.sharing), pods), plan


def visible(alloc: Allocator, plan: Any, count: int = 10) -> str:
    return alloc.allocate(plan, [f"0-{k}" for k in range(count)]).envs["NVIDIA_VISIBLE_DEVICES"]


def test_allocate_decides_on_the_live_pending_list_only() -> None:
    pods = Pods()
    alloc, plan = allocator(pods)
    for i in range(50):  # admitted long ago, assignments on card 0: never asked about again
        pods.add(f"running-{i}", 0, phase="Running")
    pods.add("finished", 0, phase="Succeeded")
    pods.add("new", 1)
    assert visible(alloc, plan) == f"GPU-fake-{NODE}-1"
    # the choice is made on the live Pending list; the cache (holding the pod) serves only the
    # node's own ledger check (accounting.overcommit), no live list of the running pods
    assert (pods.pending_reads, pods.cache_reads) == (1, 1)


def test_served_containers_are_remembered_while_pending_and_forgotten_after() -> None:
    pods = Pods()
    alloc, plan = allocator(pods)
    pods.add("a", 0)
    assert visible(alloc, plan) == f"GPU-fake-{NODE}-0"
    # "a" is still Pending (pulling its image) when "b" comes: "a" is not a candidate
    pods.add("b", 1)
    assert visible(alloc, plan) == f"GPU-fake-{NODE}-1"
    with pytest.raises(AllocateError, match="no pod bound to n1 waits for 10"):
        visible(alloc, plan)
    # both start: the memory of them is dropped (a pod never returns to Pending)
    pods.set_phase("a", "Running")
    pods.set_phase("b", "Running")
    with pytest.raises(AllocateError):
        visible(alloc, plan)
    assert alloc._done == set()


def test_a_restarted_agent_refuses_rather_than_guesses() -> None:
    """After a restart the agent has forgotten that it served "a" (still Pending). When
    "b" asks for the same count on another card, the two are ambiguous: refused, never
    answered with "a"'s card."""
    pods = Pods()
    pods.add("a", 0)
    first, plan = allocator(pods)
    assert visible(first, plan) == f"GPU-fake-{NODE}-0"
    restarted, plan = allocator(pods)
    pods.add("b", 1)
    with pytest.raises(AllocateError, match=r"ambiguous.*ns/a\[main\].*ns/b\[main\]"):
        visible(restarted, plan)
    # same cards: the answer does not depend on the choice, so it is given
    pods.set_phase("b", "Failed")
    pods.add("c", 0)
    assert visible(restarted, plan) == f"GPU-fake-{NODE}-0"


def test_a_sidecar_is_served_its_own_cards_and_grant() -> None:
    """kubelet calls Allocate for a sidecar (an init container with `restartPolicy: Always`)
    as for a container, and it keeps its devices for the pod's life: each gets the cards the
    scheduler assigned it by name, with its own environment."""
    pods = Pods()
    alloc, plan = allocator(pods)
    shares = {"proxy": (CardShare(0, f"GPU-fake-{NODE}-0", 300, 0),),
              "main": (CardShare(1, f"GPU-fake-{NODE}-1", 500, 0),)}
    pods.pods.append({
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
                     "annotations": {ann.ASSIGNMENT: Assignment(NODE, shares).to_json(),
                                     ann.ASSIGNED_NODE: NODE}},
        "spec": {"nodeName": NODE,
                 "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                                     "resources": {"limits": {CORE: "30"}}}],
                 "containers": [{"name": "main", "resources": {"limits": {CORE: "50"}}}]},
        "status": {"phase": "Pending"}})
    assert visible(alloc, plan, 30) == f"GPU-fake-{NODE}-0"
    assert visible(alloc, plan, 50) == f"GPU-fake-{NODE}-1"
    assert alloc._done == {("uid-p", "proxy", CORE), ("uid-p", "main", CORE)}


def test_preferred_allocation_reads_the_cache_not_the_api() -> None:
    pods = Pods()
    alloc, plan = allocator(pods)
    pods.add("a", 1, core=3)
    assert alloc.assigned_devices(plan, ["0-0", "0-1", "1-5", "1-6", "1-7"], 3) == \
        ["1-5", "1-6", "1-7"]
    assert (pods.pending_reads, pods.cache_reads) == (0, 1)


def test_preferred_allocation_falls_back_to_the_live_list_when_the_cache_lags() -> None:
    class Lagging(Pods):
        def on_node(self, node: str) -> list[dict[str, Any]]:
            self.cache_reads += 1
            return []  # the watch has not delivered the pod yet

    pods = Lagging()
    alloc, plan = allocator(pods)
    pods.add("a", 1, core=3)
    assert alloc.assigned_devices(plan, ["0-0", "1-5", "1-6", "1-7"], 3) == ["1-5", "1-6", "1-7"]
    assert (pods.pending_reads, pods.cache_reads) == (1, 1)
    pods.pods.clear()
    assert alloc.assigned_devices(plan, ["0-0", "1-5", "1-6", "1-7"], 3) is None


def test_a_failing_list_fails_allocate_with_the_reason() -> None:
    class Broken(Pods):
        def pending_on_node(self, node: str) -> list[dict[str, Any]]:
            raise ConnectionError("apiserver unreachable")

    alloc, plan = allocator(Broken())
    with pytest.raises(AllocateError, match="cannot list this node's pending pods: apiserver"):
        visible(alloc, plan)


def test_the_agent_does_not_install_the_crd_and_names_the_file(tmp_path: Path) -> None:
    from unittest.mock import MagicMock

    from elastic_gpu.kube.errors import NotFound

    client = MagicMock()
    client.list.side_effect = NotFound(404, "NotFound", "not found")
    running = Agent(parse_config({"syncSeconds": 3600, "healthCheck": {"enabled": False}}),
                    FakeBackend.from_dict(INVENTORY, NODE), NODE, client=client,
                    plugin_dir=tmp_path)
    with pytest.raises(InventoryApiError, match=r"kubectl apply -f deploy/crds/gpudevices.yaml"):
        running.start()
    client.create.assert_not_called()
    client.patch.assert_not_called()
