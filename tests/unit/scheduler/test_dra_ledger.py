"""The ledger check across both paths (egpu_testing.dra_ledger) sees what it must: shares of
one card summed over claims and pod assignments, a whole card held twice, a MIG instance
allocated twice, a device no node has."""

from __future__ import annotations

from typing import Any

from egpu_testing.dra_ledger import claim_card_use, over_capacity
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.resources import MigProfile

DRA = Node("d", 1000, 1000, (
    Card(0, "GPU-d-0", "A100", 81920),
    Card(1, "GPU-d-1", "A100", 81920,
         mig=(MigInstance(MigProfile.parse("1g.10gb"), "MIG-d-1-0", 0),))))
DP = Node("p", 1000, 1000, (Card(0, "GPU-p-0", "A100", 81920),))


def claim(name: str, device: str, consumed: dict[str, str] | None = None,
          pool: str = "d") -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": pool,
                              "device": device}
    if consumed:
        result["consumedCapacity"] = consumed
    return {"metadata": {"namespace": "ns", "name": name},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def pod(name: str, node: str, share: CardShare) -> dict[str, Any]:
    assignment = Assignment(node, {"main": (share,)})
    return {"metadata": {"namespace": "ns", "name": name,
                         "annotations": {"elasticgpu.io/assignment": assignment.to_json()}},
            "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def test_two_halves_fill_a_card_and_a_third_overfills_it() -> None:
    half = {"compute": "50", "memory": "4Gi"}
    claims = [claim("a", "gpu-0", half), claim("b", "gpu-0", half)]
    use, problems = claim_card_use(claims, [DRA])
    assert problems == [] and (use[("d", 0)].milli, use[("d", 0)].memory_mib) == (1000, 8192)
    assert over_capacity([], claims, [DRA, DP]) == []
    assert over_capacity([], [*claims, claim("c", "gpu-0", {"compute": "10"})], [DRA, DP])


def test_claims_and_assignments_are_summed_per_card() -> None:
    # the same node's card held by a pod's assignment and a claim: over capacity
    pods = [pod("dp", "d", CardShare(0, "GPU-d-0", 600, 1024))]
    problems = over_capacity(pods, [claim("a", "gpu-0", {"compute": "50"})], [DRA, DP])
    assert problems and "d card 0" in problems[0]
    # a pod on the device-plugin node and a claim on the DRA node: no problem
    pods = [pod("dp", "p", CardShare(0, "GPU-p-0", 1000, 81920))]
    assert over_capacity(pods, [claim("w", "gpu-0")], [DRA, DP]) == []


def test_a_mig_instance_twice_and_an_unknown_device_are_problems() -> None:
    mig = [claim("m1", "gpu-1-mig-0-1g-10gb"), claim("m2", "gpu-1-mig-0-1g-10gb")]
    problems = over_capacity([], mig, [DRA])
    assert any("MIG instance MIG-d-1-0" in p for p in problems), problems
    problems = over_capacity([], [claim("x", "gpu-7")], [DRA])
    assert problems and "gpu-7" in problems[0]
    problems = over_capacity([], [claim("y", "gpu-0", pool="elsewhere")], [DRA])
    assert problems and "no node of ours" in problems[0]
