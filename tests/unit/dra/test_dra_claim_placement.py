"""The DRA allocator's pure half: slices read back as cards, claims as engine asks, placements
as allocations (issue 41)."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.admission.mutators.dra_gate import dra_gate, wants_gate
from elastic_gpu.core.dra.allocation import allocated_devices
from elastic_gpu.core.dra.claim_placement import (
    Unplaceable,
    allocation,
    claim_asks,
    claim_assignment,
    pod_request,
)
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.devices import device_table, node_slices
from elastic_gpu.core.dra.inventory import cards_from_slices, claim_hold, claim_key, tables_of
from elastic_gpu.core.dra.podclaims import FoundClaim, PodDraClaims
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.resources import MigProfile


def _cards(n: int, memory: int = 81920) -> list[Card]:
    return [Card(i, f"GPU-{i}", "A100", memory) for i in range(n)]


def _claim(name: str, *, percent: int | None = None, memory: str | None = None,
           count: int | None = None, cls: str = CARD_CLASS, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, **extra}
    if count is not None:
        exactly["count"] = count
    if percent is not None or memory is not None:
        requests = {}
        if percent is not None:
            requests["compute"] = str(percent)
        if memory is not None:
            requests["memory"] = memory
        exactly["capacity"] = {"requests": requests}
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def test_slices_read_back_as_the_cards_the_agent_published() -> None:
    cards = [*_cards(2), Card(2, "GPU-2", "A100", 81920, health=Health.UNHEALTHY),
             Card(3, "GPU-3", "A100", 81920,
                  mig=(MigInstance(MigProfile(3, 40), 0, "MIG-0"),))]
    old = node_slices("n1", cards[:1], generation=1)
    read = cards_from_slices([*old, *node_slices("n1", cards, generation=2),
                              *node_slices("n2", _cards(1), generation=1)])
    assert sorted(read) == ["n1", "n2"]
    by_index = {c.index: c for c in read["n1"]}
    assert sorted(by_index) == [0, 1, 2]  # the MIG card is the MIG class's, not placeable
    assert by_index[0].memory_mib == 81920 and by_index[0].compute_milli == 1000
    assert by_index[2].health is Health.UNHEALTHY


def test_claims_become_engine_asks_and_what_the_engine_cannot_express_is_refused() -> None:
    share = claim_asks(_claim("c", percent=25, memory="8Gi"))
    assert (share[0].percent, share[0].memory_mib, share[0].count) == (25, 8192, 1)
    assert claim_asks(_claim("c", count=2))[0].count == 2
    mig = claim_asks(_claim("c", cls=MIG_CLASS, count=2))[0]  # any instance (issue 42)
    assert mig.mig is not None and mig.count == 2
    for bad in (_claim("c", cls="other.example.com"), _claim("c", percent=30),
                _claim("c", cls=MIG_CLASS, adminAccess=True),
                _claim("c", cls=MIG_CLASS, selectors=[{"cel": {"expression": "true"}}]),
                _claim("c", percent=150, memory="1Gi"),
                _claim("c", selectors=[{"cel": {"expression": "true"}}]),
                _claim("c", allocationMode="All")):
        with pytest.raises(Unplaceable):
            claim_asks(bad)
    allocated = {**_claim("c", count=1), "status": {"allocation": {"devices": {}}}}
    with pytest.raises(Unplaceable):
        claim_asks(allocated)


def _engine(nodes: dict[str, int]) -> Engine:
    return Engine([Node(name, 0, 0, tuple(_cards(n))) for name, n in nodes.items()],
                  PolicyConfig(node_policy="binpack", check_host_resources=False))


def test_a_pods_claims_are_placed_together_packed_and_read_back_as_the_same_hold() -> None:
    engine = _engine({"a": 4, "b": 4})
    # node b already half used by a claim someone else allocated
    tables = tables_of({"a": _cards(4), "b": _cards(4)})
    other = {"metadata": {"name": "x", "namespace": "ns"}, "status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.elasticgpu.io",
                                 "pool": "b", "device": "gpu-0"},
                                {"request": "gpu", "driver": "gpu.elasticgpu.io",
                                 "pool": "b", "device": "gpu-1"}]}}}}
    hold = claim_hold(other, tables)
    assert hold is not None and hold.node == "b"
    engine.allocate(claim_key("ns", "x"), hold)
    claims = [("one", claim_asks(_claim("one", count=1))),
              ("half", claim_asks(_claim("half", percent=50, memory="16Gi")))]
    request = pod_request("ns", "p", "uid", claims)
    assert isinstance(request, PodRequest) and len(request.containers) == 2
    node = engine.best(request, engine.nodes())
    assert node == "b"  # binpack: the fuller node, not the first one
    assignment = engine.assign(request, node)
    sizes = {c.index: (c.memory_mib, 100) for c in _cards(4)}
    for name, asks in claims:
        part = claim_assignment(assignment, name, asks)
        body = allocation(assignment, name, asks, sizes,
                          [f"aaaaaaaa-aaaa-aaaa-aaaa-00000000000{i}" for i in range(2)],
                          "2026-01-01T00:00:00Z")
        assert body["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["b"]
        results = body["devices"]["results"]
        assert all(r["shareID"] and r["pool"] == "b" for r in results)
        # what the kubelet plugin and the ledger read from it is what the engine holds
        read = allocated_devices({"status": {"allocation": body}}, "b", device_table(_cards(4)))
        assert [d.share for d in read] == list(part.containers["claim"])
        engine.allocate(claim_key("ns", name), part)
    assert body["devices"]["results"][0]["consumedCapacity"] == {"compute": "50",
                                                                 "memory": "16384Mi"}


def _claims(*classes: str, opted_out: frozenset[str] = frozenset()) -> PodDraClaims:
    """A pod's claims as the webhook reads them: one entry per class."""
    found: dict[str, FoundClaim | None] = {
        f"c{i}": FoundClaim({"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": cls}}]}})
        for i, cls in enumerate(classes)}
    return PodDraClaims(found, opted_out)


def test_the_gate_goes_on_pods_with_claims_of_our_card_or_mig_class_unless_opted_out() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    ours = _claims(CARD_CLASS)
    data = MutationInput(pod, PodRequest("p"), ClusterFacts(), dra=ours)
    assert dra_gate(data) == [{"op": "add", "path": "/spec/schedulingGates",
                               "value": [{"name": "elasticgpu.io/dra-placement"}]}]
    gated = {**pod, "spec": {"schedulingGates": [{"name": "elasticgpu.io/dra-placement"}]}}
    assert dra_gate(MutationInput(gated, PodRequest("p"), ClusterFacts(), dra=ours)) == []
    assert wants_gate(_claims(MIG_CLASS))  # MIG claims are placed by our engine too
    assert not wants_gate(_claims(MIG_CLASS, opted_out=frozenset({MIG_CLASS})))
    assert not wants_gate(_claims("other.example.com"))
    assert not wants_gate(_claims(CARD_CLASS, opted_out=frozenset({CARD_CLASS})))
    assert wants_gate(_claims(MIG_CLASS, CARD_CLASS))
    # a firstAvailable subrequest of our card class is ours too; a claim not found names none
    first = PodDraClaims({"t": FoundClaim({"devices": {"requests": [{
        "name": "gpu", "firstAvailable": [
            {"name": "a", "deviceClassName": "other.example.com"},
            {"name": "b", "deviceClassName": CARD_CLASS}]}]}}), "gone": None})
    assert first.classes() == {CARD_CLASS, "other.example.com"}
    assert wants_gate(first)


def test_count_n_with_capacity_is_n_shares_on_n_distinct_cards_read_back_alike() -> None:
    (ask,) = claim_asks(_claim("multi", percent=30, memory="8Gi", count=2))
    assert (ask.count, ask.percent, ask.memory_mib) == (2, 30, 8192)
    # a node of 4 cards whose card 0 has room for one such share only: binpack takes it,
    # yet never two shares of one card
    engine = _engine({"b": 4})
    tables = tables_of({"b": _cards(4)})
    other = {"metadata": {"name": "x", "namespace": "ns"}, "status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "b",
                                 "device": "gpu-0", "consumedCapacity": {
                                     "compute": "60", "memory": "8Gi"}}]}}}}
    hold = claim_hold(other, tables)
    assert hold is not None
    engine.allocate(claim_key("ns", "x"), hold)
    request = pod_request("ns", "p", "uid", [("multi", [ask])])
    (container,) = request.containers
    assert container.cards == 2
    node = engine.best(request, engine.nodes())
    assert node == "b"
    assignment = engine.assign(request, node)
    part = claim_assignment(assignment, "multi", [ask])
    shares = part.containers["claim"]
    assert len({s.index for s in shares}) == 2 and 0 in {s.index for s in shares}
    assert {(s.milli, s.memory_mib) for s in shares} == {(300, 8192)}
    body = allocation(assignment, "multi", [ask], {c.index: (c.memory_mib, 100)
                                                  for c in _cards(4)},
                      ["aaaaaaaa-aaaa-aaaa-aaaa-000000000001",
                       "aaaaaaaa-aaaa-aaaa-aaaa-000000000002"], "2026-01-01T00:00:00Z")
    results = body["devices"]["results"]
    assert [r["request"] for r in results] == ["gpu", "gpu"]
    assert len({r["device"] for r in results}) == 2 and len({r["shareID"] for r in results}) == 2
    assert all(r["consumedCapacity"] == {"compute": "30", "memory": "8192Mi"} for r in results)
    # the kubelet plugin, the ledger and the allocator after a restart read the same hold
    read = allocated_devices({"status": {"allocation": body}}, "b", device_table(_cards(4)))
    assert [d.share for d in read] == list(shares)
    again = claim_hold({"metadata": {"name": "multi", "namespace": "ns"},
                        "status": {"allocation": body}}, tables)
    assert again is not None and list(again.containers["claim"]) == list(shares)
    # 80 % on three distinct cards: two cards have that room (one would have it thrice over
    # in total, but a request's devices are distinct), so it does not fit
    engine.allocate(claim_key("ns", "multi"), part)
    three = pod_request("ns", "q", "uid2", [("three", claim_asks(_claim(
        "three", percent=80, memory="8Gi", count=3)))])
    assert engine.best(three, ["b"]) is None
    two = pod_request("ns", "q", "uid2", [("two", claim_asks(_claim(
        "two", percent=80, memory="8Gi", count=2)))])
    assert engine.best(two, ["b"]) == "b"
