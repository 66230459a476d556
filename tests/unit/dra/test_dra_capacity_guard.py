"""core.dra.capacity_guard: the node's last word on a claim that would put a card over capacity
(issue 41, the ledger stays exact whoever allocates)."""

from __future__ import annotations

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.allocation import allocated_devices
from elastic_gpu.core.dra.capacity_guard import Holding, overflows, refusal
from elastic_gpu.core.dra.devices import DRIVER, device_table
from elastic_gpu.core.model import Card, MigInstance
from elastic_gpu.core.resources import MigProfile

A100 = "NVIDIA A100-SXM4-80GB"
CARDS = [Card(0, "GPU-0", A100, 81920), Card(1, "GPU-1", A100, 81920),
         Card(2, "GPU-2", A100, 81920,
              mig=(MigInstance(MigProfile.parse("3g.40gb"), "MIG-a", 0),
                   MigInstance(MigProfile.parse("3g.40gb"), "MIG-b", 4)))]


def _held(claim: str, device: str, **consumed: str) -> list[Holding]:
    result: dict[str, object] = {"request": "gpu", "driver": DRIVER, "pool": "n1",
                                 "device": device}
    if consumed:
        result["consumedCapacity"] = consumed
    obj = {"status": {"allocation": {"devices": {"results": [result]}}}}
    return [Holding(claim, d.device, d.share)
            for d in allocated_devices(obj, "n1", device_table(CARDS))]


def test_shares_that_fit_beside_the_prepared_claims_pass() -> None:
    prepared = _held("ns/a", "gpu-0", compute="50", memory="40Gi")
    assert overflows(CARDS, prepared, _held("ns/b", "gpu-0", compute="50", memory="40Gi")) == []
    # another card is another card
    assert overflows(CARDS, _held("ns/w", "gpu-1"), _held("ns/b", "gpu-0")) == []


def test_a_share_past_the_card_is_refused_naming_device_sums_and_holders() -> None:
    prepared = [*_held("ns/a", "gpu-0", compute="60", memory="8Gi"),
                *_held("ns/other-card", "gpu-1")]
    found = overflows(CARDS, prepared, _held("ns/b", "gpu-0", compute="50", memory="8Gi"))
    assert [(o.device, o.milli, o.memory_mib, o.mig) for o in found] == [
        ("gpu-0", 1100, 16384, False)]
    text = refusal("ResourceClaim ns/b", found)
    assert text is not None
    assert text.startswith("ResourceClaim ns/b: refused, it would put a device over capacity: "
                           "device gpu-0 would hold compute 110 % of 100 % with the claims "
                           "prepared on this node (ns/a: 60 %, 8192 MiB)")
    assert "ns/other-card" not in text
    assert "by kube-scheduler from a cache that had not seen the other claim" in text


def test_memory_alone_can_overflow() -> None:
    found = overflows(CARDS, _held("ns/a", "gpu-0", compute="10", memory="70Gi"),
                      _held("ns/b", "gpu-0", compute="10", memory="20Gi"))
    assert "memory 92160 of 81920 MiB" in found[0].describe()
    assert "compute" not in found[0].describe()


def test_whole_card_allocations_are_exclusive() -> None:
    # a claim asking no capacity consumes the whole card: nothing fits beside it, either way
    whole = _held("ns/w", "gpu-0")
    assert overflows(CARDS, whole, _held("ns/s", "gpu-0", compute="1", memory="1Mi"))
    assert overflows(CARDS, _held("ns/s", "gpu-0", compute="1", memory="1Mi"), whole)
    assert overflows(CARDS, whole, _held("ns/w2", "gpu-0"))


def test_a_mig_instance_has_one_holder() -> None:
    a = _held("ns/a", "gpu-2-mig-0-3g-40gb")
    found = overflows(CARDS, a, _held("ns/b", "gpu-2-mig-0-3g-40gb"))
    assert [(o.device, o.mig) for o in found] == [("gpu-2-mig-0-3g-40gb", True)]
    assert found[0].describe() == "MIG device gpu-2-mig-0-3g-40gb is already prepared for ns/a"
    assert overflows(CARDS, a, _held("ns/b", "gpu-2-mig-4-3g-40gb")) == []


def test_one_claim_alone_past_a_card_and_a_card_already_over_without_it() -> None:
    two = [Holding("ns/x", "gpu-0", CardShare(0, "GPU-0", 600, 100)),
           Holding("ns/x", "gpu-0", CardShare(0, "GPU-0", 600, 100))]
    assert [o.holders for o in overflows(CARDS, [], two)] == [()]
    # gpu-1 is over already (someone else's doing); a claim on gpu-0 is judged on gpu-0 alone
    over = [*_held("ns/a", "gpu-1"), *_held("ns/b", "gpu-1")]
    assert overflows(CARDS, over, _held("ns/c", "gpu-0", compute="10", memory="1Gi")) == []
    assert refusal("x", []) is None


def test_the_allocator_sees_its_claims_given_twice_on_their_node_only() -> None:
    from elastic_gpu.core.assignment import Assignment
    from elastic_gpu.core.dra.capacity_guard import claims_overflowing

    def hold(node: str, milli: int, index: int = 0) -> Assignment:
        return Assignment(node, {"claim": (CardShare(index, f"GPU-{index}", milli, 1024),)})
    cards = {"n1": CARDS, "n2": CARDS}
    holds = {"ours": hold("n1", 600), "theirs": hold("n1", 600), "elsewhere": hold("n2", 900),
             "fits": hold("n2", 100)}
    (found,) = claims_overflowing(["ours"], holds, cards)
    assert (found.device, found.milli, [h.claim for h in found.holders]) == (
        "gpu-0 of node n1", 1200, ["theirs"])
    assert claims_overflowing(["fits"], holds, cards) == []
    assert claims_overflowing(["ours"], {**holds, "ours": hold("n1", 600, 1)}, cards) == []


def test_the_taken_back_event_names_the_claim_the_card_and_the_other_holder() -> None:
    """Issue 41: the Warning Event on a pod whose claim the allocator cleared."""
    from elastic_gpu.core.assignment import Assignment
    from elastic_gpu.core.dra.capacity_guard import claims_overflowing, taken_back_message
    from elastic_gpu.core.dra.inventory import claim_key

    def hold(milli: int) -> Assignment:
        return Assignment("n1", {"claim": (CardShare(0, "GPU-0", milli, 1024),)})
    ours, theirs = claim_key("team", "ours"), claim_key("team", "theirs")
    found = claims_overflowing([ours], {ours: hold(600), theirs: hold(600)}, {"n1": CARDS})
    assert taken_back_message(["ours"], found) == (
        "allocation of claim ours taken back before the pod's gate was lifted: a card was "
        "given twice: device gpu-0 of node n1 would hold compute 120 % of 100 % with the claims "
        "allocated on the node (team/theirs: 60 %, 1024 MiB) (the others allocated by another "
        "writer, kube-scheduler's allocator for a pod our gate does not hold, from a cache that "
        "had not seen ours); the pod stays gated and is placed again")


def test_the_allocators_check_reads_the_claims_and_slices_as_the_api_holds_them() -> None:
    """`given_twice`: the allocator's check before a lift, from every claim and the slices; a
    claim on another node, or not allocated, does not count."""
    from egpu_testing.dra import claim_object, result
    from elastic_gpu.core.dra.capacity_guard import given_twice
    from elastic_gpu.core.dra.devices import node_slices

    slices = node_slices("n1", CARDS[:2], 1) + node_slices("n2", CARDS[:2], 1)
    half = {"compute": "60", "memory": "1Gi"}

    def claim(name: str, node: str, device: str, allocated: bool = True) -> dict[str, object]:
        return claim_object(name, "team", f"uid-{name}", node,
                            [result(node, device, consumed=half)] if allocated else None)
    ours = claim("ours", "n1", "gpu-0")
    others = [claim("elsewhere", "n2", "gpu-0"), claim("open", "n1", "gpu-0", False),
              claim("next-card", "n1", "gpu-1")]
    assert given_twice("team", ["ours"], [ours, *others], slices) == []
    (found,) = given_twice("team", ["ours"], [ours, *others, claim("theirs", "n1", "gpu-0")],
                           slices)
    assert (found.device, found.milli, [h.claim for h in found.holders]) == (
        "gpu-0 of node n1", 1200, ["team/theirs"])
    assert given_twice("other-team", ["ours"], [ours], slices) == []  # not ours to check


def test_the_allocators_check_sees_a_mig_instance_given_twice() -> None:
    """The sandbox's race: kube-scheduler's allocator gave a handed-over claim the instance our
    allocator had just given ours; the check before our lift must see the instance's two
    holders (it read only the card devices before)."""
    from egpu_testing.dra import claim_object, result
    from elastic_gpu.core.dra.capacity_guard import given_twice
    from elastic_gpu.core.dra.devices import node_slices

    slices = node_slices("n1", CARDS, 1)

    def claim(name: str, device: str) -> dict[str, object]:
        return claim_object(name, "team", f"uid-{name}", "n1", [result("n1", device)])
    ours = claim("ours", "gpu-2-mig-0-3g-40gb")
    assert given_twice("team", ["ours"], [ours, claim("next", "gpu-2-mig-4-3g-40gb")],
                       slices) == []
    (found,) = given_twice("team", ["ours"], [ours, claim("theirs", "gpu-2-mig-0-3g-40gb")],
                           slices)
    assert found.mig and [h.claim for h in found.holders] == ["team/theirs"]
    assert found.device == "gpu-2-mig-0-3g-40gb of node n1"
