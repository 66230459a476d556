"""Allocate of `elasticgpu.io/gpu-tflops` (issue 28): the container gets the card and the share
the scheduler computed for that card's model, and never less than the TFLOPS it asked.

The pods are the dicts the API returns, in a list (tests/integration/agent/
test_tflops_realnode.py runs the same through a real kubelet)."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.backends.isolation import nvidia_isolation
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.devices import PluginKind, ResourcePlan, build_plans, logical_cards
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.agent.matching import AllocateError
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.resources import GPU_TFLOPS
from elastic_gpu.core.tflops import share_milli

NODE = "n1"
A100 = "A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
INVENTORY = {"cards": [{"model": A100, "memoryMiB": 81920}, {"model": H100, "memoryMiB": 81920}]}


class Pending:
    """The node's Pending pods, as the live list returns them."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    on_node = live_on_node = pending_on_node


def tflops_pod(name: str, tflops: int, shares: tuple[CardShare, ...]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {ann.ASSIGNMENT: Assignment(NODE, {"main": shares})
                                         .to_json(), ann.ASSIGNED_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "resources": {"limits": {GPU_TFLOPS: str(tflops)}}}]},
            "status": {"phase": "Pending"}}


def share(card: int, milli: int) -> CardShare:
    return CardShare(card, f"GPU-fake-{NODE}-{card}", milli, 0)


def allocator(pods: list[dict[str, Any]], mode: str = "accounting"
              ) -> tuple[Allocator, ResourcePlan]:
    config = parse_config({"healthCheck": {"enabled": False}, "sharing": {"mode": mode}})
    cards = logical_cards(FakeBackend.from_dict(INVENTORY, NODE).discover(), False)
    (plan,) = [p for p in build_plans(cards, config) if p.resource == GPU_TFLOPS]
    return Allocator(NODE, config, NodeState(cards), "NVIDIA_VISIBLE_DEVICES",
                     DeviceFiles({}, ()), nvidia_isolation(config.sharing), Pending(pods)), plan


def ids(plan: ResourcePlan, count: int) -> list[str]:
    return [unit.id for unit in plan.devices[:count]]


@pytest.mark.parametrize(("card", "model", "milli"), [(0, A100, 321), (1, H100, 102)])
def test_a_tflops_container_gets_the_share_computed_for_its_cards_model(
        card: int, model: str, milli: int) -> None:
    assert share_milli(model, 100) == milli  # what the scheduler writes for this model
    alloc, plan = allocator([tflops_pod("p", 100, (share(card, milli),))], mode="mps")
    assert plan.kind is PluginKind.TFLOPS
    # kubelet passes 100 device IDs (one per TFLOPS), from any card: the assignment decides.
    grant = alloc.allocate(plan, ids(plan, 100))
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE}-{card}"
    assert grant.envs["EGPU_CORE_PERCENT"] == str(milli // 10)
    # The share is held by the isolation provider as any percent share is.
    assert grant.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(milli // 10)


def test_an_assignment_giving_less_than_the_tflops_asked_is_refused() -> None:
    # 100 TFLOPS on an A100 (312) needs 321 milli; an assignment of 300 would give 93.6.
    alloc, plan = allocator([tflops_pod("short", 100, (share(0, 300),))])
    with pytest.raises(AllocateError, match=r"less than the 100 asked \(needs 321 milli\)"):
        alloc.allocate(plan, ids(plan, 100))
    assert alloc.outcomes[GPU_TFLOPS, "refused"] == 1


def test_a_tflops_request_above_the_assigned_cards_tflops_is_refused() -> None:
    alloc, plan = allocator([tflops_pod("big", 500, (share(0, 1000),))])
    with pytest.raises(AllocateError, match="500 TFLOPS is more than a A100-SXM4-80GB card's 312"):
        alloc.allocate(plan, ids(plan, 500))


def test_a_tflops_request_assigned_two_cards_is_refused() -> None:
    alloc, plan = allocator([tflops_pod("two", 100, (share(0, 321), share(1, 102)))])
    with pytest.raises(AllocateError, match=r"asks for a share on 1 card\(s\) but is assigned 2 cards"):
        alloc.allocate(plan, ids(plan, 100))


def test_only_the_container_asking_that_many_tflops_is_a_candidate() -> None:
    alloc, plan = allocator([tflops_pod("fifty", 50, (share(0, 161),)),
                             tflops_pod("hundred", 100, (share(1, 102),))])
    assert alloc.allocate(plan, ids(plan, 100)).envs["NVIDIA_VISIBLE_DEVICES"] == \
        f"GPU-fake-{NODE}-1"
    assert alloc.allocate(plan, ids(plan, 50)).envs["NVIDIA_VISIBLE_DEVICES"] == \
        f"GPU-fake-{NODE}-0"
