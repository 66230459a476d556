"""Allocate of a memory-only share (issue 40): the container's isolation limits its memory and
not its compute.

The webhook gives a memory-only share (`elasticgpu.io/gpu-memory` alone, HAMi's `gpumem`
without `gpucores`, KAI's `gpu-memory`) one device of the share plugin, 1 % of the card, so
that kubelet calls Allocate; the ledger bills that 1 %. Allocate reads the container's
resources (`core.request.limits_compute`) and gives it no compute limit, as HAMi leaves
compute unlimited without `gpucores`. Pods here are stored as the webhook leaves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import AgentConfig, parse_config
from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.devices import ResourcePlan, build_plans, logical_cards
from elastic_gpu.agent.grant import DeviceFiles, Grant
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare

CORE = "elasticgpu.io/gpu-core"
MEMORY = "elasticgpu.io/gpu-memory"
NODE = "n1"
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 40960} for _ in range(3)]}


class Pods:
    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def add(self, name: str, cards: tuple[int, ...], milli: int, mib: int,
            limits: dict[str, str]) -> None:
        shares = tuple(CardShare(c, f"GPU-fake-{NODE}-{c}", milli, mib) for c in cards)
        self.pods.append({
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-01-01T00:00:{len(self.pods):02d}Z",
                         "annotations": {ann.ASSIGNMENT: Assignment(NODE, {"main": shares})
                                         .to_json(), ann.ASSIGNED_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "resources": {"limits": limits, "requests": limits}}]},
            "status": {"phase": "Pending"}})

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["status"]["phase"] == "Pending"]

    on_node = live_on_node = pending_on_node

    def served(self, name: str) -> None:
        (pod,) = [p for p in self.pods if p["metadata"]["name"] == name]
        pod["status"]["phase"] = "Running"


def sharing(mode: str, tmp_path: Path) -> dict[str, Any]:
    if mode != "hami-core":
        return {"mode": mode}
    library = tmp_path / "libvgpu.so"
    library.write_text("stand-in\n")
    return {"mode": mode, "hamiCore": {"library": str(library),
                                       "cacheDirectory": str(tmp_path / "containers"),
                                       "lockDirectory": str(tmp_path / "vgpulock")}}


def allocator(pods: Pods, mode: str, tmp_path: Path) -> tuple[Allocator, ResourcePlan]:
    config: AgentConfig = parse_config({"healthCheck": {"enabled": False},
                                        "sharing": sharing(mode, tmp_path)})
    backend = FakeBackend.from_dict(INVENTORY, NODE)
    cards = logical_cards(backend.discover(), config.splitBoard)
    (plan,) = [p for p in build_plans(cards, config) if p.resource == CORE]
    return Allocator(NODE, config, NodeState(cards), "NVIDIA_VISIBLE_DEVICES",
                     DeviceFiles({}, ()), backend.isolation(config.sharing), pods), plan


def allocate(alloc: Allocator, plan: ResourcePlan, pods: Pods, name: str, count: int) -> Grant:
    grant = alloc.allocate(plan, [f"0-{k}" for k in range(count)])
    pods.served(name)
    return grant


def test_hami_core_leaves_a_memory_only_shares_compute_unlimited(tmp_path: Path) -> None:
    pods = Pods()
    alloc, plan = allocator(pods, "hami-core", tmp_path)
    # as the webhook stores `elasticgpu.io/gpu-memory: 3000` (and HAMi's example.yaml)
    pods.add("memory-only", (0,), 10, 3000, {MEMORY: "3000", CORE: "1"})
    grant = allocate(alloc, plan, pods, "memory-only", 1)
    assert grant.envs["CUDA_DEVICE_SM_LIMIT"] == "0"  # HAMi-core: no limit (was "1")
    assert grant.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert grant.envs["EGPU_CORE_PERCENT"] == "1"  # what the ledger bills
    # a share that asks compute keeps its limit
    pods.add("shared", (1,), 300, 3000, {MEMORY: "3000", CORE: "30"})
    grant = allocate(alloc, plan, pods, "shared", 30)
    assert grant.envs["CUDA_DEVICE_SM_LIMIT"] == "30"


def test_hami_core_a_multi_card_memory_only_share_is_unlimited_on_each_card(
        tmp_path: Path) -> None:
    """HAMi's memory-fraction example (`nvidia.com/gpu: 2`, memory only) as stored."""
    pods = Pods()
    alloc, plan = allocator(pods, "hami-core", tmp_path)
    pods.add("fraction", (0, 2), 10, 20480,
             {"elasticgpu.io/gpu": "2", MEMORY: "20480", CORE: "1"})
    grant = allocate(alloc, plan, pods, "fraction", 1)
    assert {k: v for k, v in grant.envs.items() if k.startswith("CUDA_DEVICE_SM_LIMIT")} == {
        "CUDA_DEVICE_SM_LIMIT": "0", "CUDA_DEVICE_SM_LIMIT_0": "0", "CUDA_DEVICE_SM_LIMIT_1": "0"}
    assert grant.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "20480m"


@pytest.mark.parametrize("limits,percent", [
    ({MEMORY: "3000", CORE: "1"}, "100"),  # memory only: the whole card's threads
    ({CORE: "1"}, "1"),  # asked 1 % of compute: held to it
])
def test_mps_thread_percentage_follows_what_was_asked(tmp_path: Path, limits: dict[str, str],
                                                      percent: str) -> None:
    pods = Pods()
    alloc, plan = allocator(pods, "mps", tmp_path)
    pods.add("p", (0,), 10, 3000 if MEMORY in limits else 0, limits)
    grant = allocate(alloc, plan, pods, "p", 1)
    assert grant.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
