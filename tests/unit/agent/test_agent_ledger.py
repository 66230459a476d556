"""The agent's own ledger (issue #26 item 1): Allocate serves only an assignment the scheduler's
Binding wrote, and never cards the other live pods of the node already fill, whatever a pod
carries (a copy of another pod's assignment included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from elastic_gpu.agent.accounting import overcommit
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.backends.isolation import cuda_mps_isolation
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.devices import ResourcePlan, build_plans, logical_cards
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.agent.matching import AllocateError, Candidate, candidates
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare

NODE = "n1"
CORE = "elasticgpu.io/gpu-core"
MEMORY = {0: 40960, 1: 40960}


def pod(name: str, shares: list[CardShare], *, phase: str = "Running", node: str = NODE,
        assigned: str | None = NODE, deleting: bool = False, terminated: bool = False,
        claims: dict[str, str] | None = None) -> dict[str, Any]:
    assignment = Assignment(node, {"main": tuple(shares)}, claims or {})
    notes = {ann.ASSIGNMENT: assignment.to_json()}
    if assigned is not None:
        notes[ann.ASSIGNED_NODE] = assigned
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                            "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": notes}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    core = sum(s.milli for s in shares) // 10
    status: dict[str, Any] = {"phase": phase}
    if terminated:
        status["containerStatuses"] = [{"name": "main", "state": {"terminated": {"exitCode": 0}}}]
    return {"metadata": meta, "spec": {"nodeName": NODE, "containers": [
        {"name": "main", "resources": {"limits": {CORE: str(core)}}}]}, "status": status}


def share(index: int, milli: int, memory: int = 0, mig: str | None = None) -> CardShare:
    return CardShare(index, f"GPU-{index}", milli, memory, "1g.10gb" if mig else None, mig)


def chosen(p: dict[str, Any]) -> Candidate:
    (found,), _ = candidates([p], NODE, CORE, int(p["spec"]["containers"][0]["resources"]
                                                  ["limits"][CORE]), ())
    return found


def test_a_copy_of_a_running_pods_assignment_is_not_served() -> None:
    victim = pod("victim", [share(0, 1000)])
    thief = pod("thief", [share(0, 1000)], phase="Pending")
    problem = overcommit(chosen(thief), [victim, thief], NODE, MEMORY)
    assert problem is not None and "card 0 would be given 2000 milli-cards of 1000" in problem
    assert "held by ns/victim[main]" in problem


def test_shares_that_fit_together_are_served() -> None:
    half, rest = pod("half", [share(0, 500, 8192)]), pod("rest", [share(0, 500, 8192)], phase="Pending")
    assert overcommit(chosen(rest), [half, rest], NODE, MEMORY) is None
    over = pod("over", [share(0, 600)], phase="Pending")
    assert overcommit(chosen(over), [half, over], NODE, MEMORY) is not None
    big = pod("big", [share(0, 100, 40000)], phase="Pending")
    problem = overcommit(chosen(big), [half, big], NODE, MEMORY)
    assert problem is not None and "48192 MiB of 40960" in problem


@pytest.mark.parametrize("holder", [
    pod("done", [share(0, 1000)], phase="Succeeded"),
    # deleted and its container reported terminated (one still running holds its card:
    # tests/unit/core/test_held_cards_everywhere.py)
    pod("stopped", [share(0, 1000)], deleting=True, terminated=True),
    pod("unbound-forgery", [share(0, 1000)], assigned=None),
    pod("elsewhere", [share(0, 1000)], node="n2", assigned="n2"),
])
def test_what_holds_no_card_on_the_node_is_not_counted(holder: dict[str, Any]) -> None:
    new = pod("new", [share(0, 1000)], phase="Pending")
    assert overcommit(chosen(new), [holder, new], NODE, MEMORY) is None


def test_an_assignment_the_binding_did_not_write_is_no_candidate() -> None:
    forged = pod("forged", [share(0, 1000)], phase="Pending", assigned=None)
    found, problems = candidates([forged], NODE, CORE, 100, ())
    assert found == [] and "not the scheduler's" in problems[0]


def test_pods_sharing_a_claim_share_its_cards_and_mig_instances_are_exclusive() -> None:
    first = pod("first", [share(0, 1000)], claims={"main": "egpu-1"})
    second = pod("second", [share(0, 1000)], phase="Pending", claims={"main": "egpu-1"})
    assert overcommit(chosen(second), [first, second], NODE, MEMORY) is None
    mig = pod("mig", [share(1, 142, 10240, mig="MIG-a")])
    again = pod("again", [share(1, 142, 10240, mig="MIG-a")], phase="Pending")
    problem = overcommit(chosen(again), [mig, again], NODE, MEMORY)
    assert problem is not None and "MIG instance MIG-a is held by ns/mig[main]" in problem


class LivePods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["status"]["phase"] == "Pending"]

    def on_node(self, node: str) -> list[dict[str, Any]]:
        return self.pods

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.pods


def share_plan_and_allocator() -> tuple[ResourcePlan, Callable[[Any], Allocator]]:
    """The share plugin's plan of a 2-card fake node, and an Allocator over it reading the
    node's pods from the given source."""
    config = parse_config({"healthCheck": {"enabled": False}})
    backend = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}] * 2}, NODE)
    cards = logical_cards(backend.discover(), config.splitBoard)
    (plan,) = [p for p in build_plans(cards, config) if p.resource == CORE]

    def allocator(pods: Any) -> Allocator:
        return Allocator(NODE, config, NodeState(cards), "NVIDIA_VISIBLE_DEVICES",
                         DeviceFiles({}, ()),
                         cuda_mps_isolation(config.sharing), pods)

    return plan, allocator


def test_allocate_refuses_the_thief_and_serves_the_owner() -> None:

    plan, allocator = share_plan_and_allocator()
    victim = pod("victim", [CardShare(0, f"GPU-fake-{NODE}-0", 600, 0)])
    thief = pod("thief", [CardShare(0, f"GPU-fake-{NODE}-0", 600, 0)], phase="Pending")
    alloc = allocator(LivePods([victim, thief]))
    with pytest.raises(AllocateError, match="card 0 would be given 1200 milli-cards of 1000; "
                                            "held by ns/victim"):
        alloc.allocate(plan, [f"0-{k}" for k in range(60)])
    alloc = allocator(LivePods([thief]))
    grant = alloc.allocate(plan, [f"0-{k}" for k in range(60)])
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE}-0"


def test_the_ledger_check_reads_the_cache_only_when_it_shows_the_pod_being_served() -> None:

    class LaggingCache(LivePods):
        """The cache has not seen the thief's Binding yet (nor, maybe, a pod's end)."""

        def on_node(self, node: str) -> list[dict[str, Any]]:
            return [p for p in self.pods if p["metadata"]["name"] != "thief"]

    plan, allocator = share_plan_and_allocator()
    victim = pod("victim", [CardShare(0, f"GPU-fake-{NODE}-0", 600, 0)])
    thief = pod("thief", [CardShare(0, f"GPU-fake-{NODE}-0", 600, 0)], phase="Pending")
    alloc = allocator(LaggingCache([victim, thief]))
    with pytest.raises(AllocateError, match="held by ns/victim"):  # from the live list
        alloc.allocate(plan, [f"0-{k}" for k in range(60)])
