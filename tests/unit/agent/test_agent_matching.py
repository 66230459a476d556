"""Choosing the container an Allocate serves, from pods as the API returns them."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.agent.accounting import card_usage
from elastic_gpu.agent.matching import AllocateError, candidates, choose
from elastic_gpu.api.gpudevice import MAX_LISTED_PODS, allocation_status
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, MigInstance
from elastic_gpu.core.resources import MigProfile

CORE = "elasticgpu.io/gpu-core"


def pod(name: str, shares: dict[str, list[CardShare]], core: int = 30, node: str = "n1",
        created: str = "2026-01-01T00:00:00Z", **extra: Any) -> dict[str, Any]:
    annotations = {ann.ASSIGNMENT: Assignment(node, {k: tuple(v) for k, v in shares.items()})
                   .to_json(), ann.ASSIGNED_NODE: node}
    annotations.update(extra.pop("annotations", {}))
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "creationTimestamp": created, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [
            {"name": c, "resources": {"limits": {CORE: str(core)}}} for c in shares]},
        "status": {"phase": extra.pop("phase", "Pending")},
    }


def share(index: int, milli: int = 300) -> CardShare:
    return CardShare(index, f"GPU-{index}", milli, 0)


def pick(pods: list[dict[str, Any]], count: int = 30, done: set[Any] | None = None) -> Any:
    found, problems = candidates(pods, "n1", CORE, count, done or set())
    return choose(found, problems, "n1", CORE, count)


def test_the_one_waiting_container_is_chosen() -> None:
    chosen = pick([pod("a", {"main": [share(0)]}), pod("b", {"main": [share(1)]}, core=50)])
    assert (chosen.pod, chosen.container, chosen.shares) == ("a", "main", (share(0),))


def test_identical_outcomes_are_not_ambiguous() -> None:
    chosen = pick([pod("late", {"main": [share(0)]}, created="2026-01-02T00:00:00Z"),
                   pod("early", {"main": [share(0)]})])
    assert chosen.pod == "early"


def test_different_cards_for_the_same_request_are_refused() -> None:
    with pytest.raises(AllocateError, match=r"ambiguous.*ns/a\[main\].*ns/b\[main\]"):
        pick([pod("a", {"main": [share(0)]}), pod("b", {"main": [share(1)]})])


def test_served_terminal_foreign_and_other_node_pods_are_skipped() -> None:
    pods = [pod("done", {"main": [share(1)]}),
            pod("finished", {"main": [share(2)]}, phase="Succeeded"),
            pod("elsewhere", {"main": [share(3)]}, node="n2"),
            pod("mine", {"main": [share(0)]})]
    # "done" was served already (the allocator's memory): not a candidate any more
    assert pick(pods, done={("uid-done", "main", CORE)}).pod == "mine"
    with pytest.raises(AllocateError, match="no pod bound to n1 waits for 30"):
        pick([pod("mine", {"main": [share(0)]})], done={("uid-mine", "main", CORE)})
    # another resource served to the same container does not count for this one
    assert pick(pods[3:], done={("uid-mine", "main", "nvidia.com/gpu")}).pod == "mine"


def test_bad_assignment_is_reported_not_used() -> None:
    bad = pod("bad", {"main": [share(0)]})
    bad["metadata"]["annotations"][ann.ASSIGNMENT] = '{"v": 9}'
    with pytest.raises(AllocateError, match="ns/bad: assignment version 9"):
        pick([bad])


def test_allocation_columns_sum_live_pods_only() -> None:
    pods = [pod("a", {"main": [share(0, 300)], "side": [share(0, 200)]}),
            pod("b", {"main": [CardShare(1, "GPU-1", 1000, 40960)]}),
            pod("gone", {"main": [share(1)]}, phase="Failed")]
    assert {i: (u.milli, u.memory_mib) for i, u in card_usage(pods, "n1", {}).items()} == {
        0: (500, 0), 1: (1000, 40960)}


A100 = Card(0, "GPU-0", "A100-SXM4-80GB", 81920,
            mig=(MigInstance(MigProfile(3, 40), "MIG-a", 0), MigInstance(MigProfile(2, 20), "MIG-b", 4),
                 MigInstance(MigProfile(1, 10), "MIG-c", 6)))


def mig_share(profile: str, uuid: str) -> CardShare:
    # as the scheduler writes a MIG share: no milli, the profile's memory
    parsed = MigProfile.parse(profile)
    return CardShare(0, "GPU-0", 0, parsed.memory_gb * 1024, profile, uuid)


def test_mig_instances_count_their_slices_and_memory() -> None:
    pods = [pod("big", {"main": [mig_share("3g.40gb", "MIG-a")]}),
            pod("small", {"main": [mig_share("1g.10gb", "MIG-c")]})]
    use = card_usage(pods, "n1", {0: A100})[0]
    assert (use.milli, use.memory_mib) == (1000 * 3 // 7 + 1000 // 7, 50 * 1024)
    assert use.holders == ["ns/big (main)", "ns/small (main)"]
    assert allocation_status(1000, use.milli, use.memory_mib, use.holders)["allocatedPercent"] == 57
    # every instance in use: the card reads (almost) full, not 0 %
    pods.append(pod("mid", {"main": [mig_share("2g.20gb", "MIG-b")]}))
    assert card_usage(pods, "n1", {0: A100})[0].milli == 1000 * 3 // 7 + 1000 * 2 // 7 + 1000 // 7
    # an A30 has 4 slices; a placement beyond the table trusts the driver
    a30 = Card(0, "GPU-0", "NVIDIA A30", 24576, mig=(MigInstance(MigProfile(2, 12), "MIG-x", 0),))
    assert card_usage([pod("a30", {"main": [mig_share("2g.12gb", "MIG-x")]})], "n1",
                      {0: a30})[0].milli == 500
    odd = Card(0, "GPU-0", "X", 1000, mig=(MigInstance(MigProfile(4, 10), "MIG-y", 6),))
    assert card_usage([pod("odd", {"main": [mig_share("4g.10gb", "MIG-y")]})], "n1",
                      {0: odd})[0].milli == 400


def test_whole_cards_read_full_and_holders_are_bounded() -> None:
    whole = pod("w", {"main": [CardShare(0, "GPU-0", 1000, 81920)]})
    use = card_usage([whole], "n1", {0: Card(0, "GPU-0", "H100", 81920)})[0]
    assert allocation_status(1000, use.milli, use.memory_mib, use.holders) == {
        "allocatedMilli": 1000, "allocatedMemoryMiB": 81920, "allocatedPercent": 100,
        "pods": ["ns/w (main)"], "podCount": 1}
    many = [pod(f"p{i:02d}", {"main": [share(1, 10)]}) for i in range(20)]
    use = card_usage(many, "n1", {})[1]
    status = allocation_status(1000, use.milli, use.memory_mib, use.holders)
    assert status["podCount"] == 20 and status["allocatedPercent"] == 20
    assert status["pods"][:2] == ["ns/p00 (main)", "ns/p01 (main)"]
    assert len(status["pods"]) == MAX_LISTED_PODS + 1 and status["pods"][-1] == "+12 more"


def test_an_ambiguity_names_a_few_candidates_and_counts_the_rest() -> None:
    pods = [pod(f"p{i}", {"main": [share(i % 2)]}) for i in range(40)]
    with pytest.raises(AllocateError) as err:
        pick(pods)
    text = str(err.value)
    assert "ns/p0[main]" in text and "and 35 more" in text and "ns/p39" not in text
