"""Issue #26 item 6, the pure half: a pre-created ElasticGPU is checked against the GPUDevice
inventory (`core.claims.inventory.inventory_problem`) and a claim never binds to one that is not
checked yet (`Pending`) or failed the check (`Failed`)."""

from __future__ import annotations

import pytest

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.decisions import Bind
from elastic_gpu.core.claims.inventory import (
    InventoryCard,
    InventoryReason,
    checked_against_inventory,
    inventory_problem,
)
from elastic_gpu.core.claims.model import Claim, ClaimRef, ElasticGPUPhase, PendingReason
from elastic_gpu.core.claims.release import Keep, decide_release

INVENTORY = {"n1": {0: InventoryCard("GPU-0"),
                    1: InventoryCard("GPU-1", frozenset({"MIG-1a"}))}}


def egpu(node: str = "n1", index: int = 0, uuid: str = "GPU-0", mig: str | None = None,
         phase: ElasticGPUPhase = ElasticGPUPhase.PENDING,
         ref: ClaimRef | None = None) -> claim_model.ElasticGPU:
    share = CardShare(index, uuid, 500, 1024, "1g.10gb" if mig else None, mig)
    return claim_model.ElasticGPU("e", {"elasticgpu.io/gpu-core": 50}, node, (share,), claim_ref=ref,
                           phase=phase)


def test_real_cards_pass() -> None:
    assert inventory_problem(egpu(), INVENTORY) is None
    assert inventory_problem(egpu(index=1, uuid="GPU-1", mig="MIG-1a"), INVENTORY) is None


@pytest.mark.parametrize(("obj", "reason", "words"), [
    (egpu(node="ghost-node"), InventoryReason.NODE_NOT_FOUND,
     "node 'ghost-node' has no GPUDevice"),
    (egpu(index=999), InventoryReason.CARD_NOT_FOUND,
     "node n1 has no card at index 999 (its cards: 0, 1)"),
    (egpu(uuid="GPU-1"), InventoryReason.UUID_MISMATCH, "card 0 of node n1 is GPU-0, not GPU-1"),
    (egpu(index=1, uuid="GPU-1", mig="MIG-x"), InventoryReason.MIG_INSTANCE_NOT_FOUND,
     "has no MIG instance MIG-x"),
])
def test_what_is_not_in_the_inventory_is_refused_with_the_reason(
        obj: claim_model.ElasticGPU, reason: InventoryReason, words: str) -> None:
    problem = inventory_problem(obj, INVENTORY)
    assert problem is not None and problem[0] is reason and words in problem[1]
    assert problem[1].startswith("ElasticGPU e:")


def test_which_elasticgpus_are_checked() -> None:
    assert checked_against_inventory(egpu())
    assert checked_against_inventory(egpu(phase=ElasticGPUPhase.FAILED))
    # pre-bound by name only (any claim of that name): an administrator's, checked
    assert checked_against_inventory(egpu(ref=ClaimRef("ns", "c")))
    # provisioned for one claim (its uid), or bound: the system's, not checked again
    assert not checked_against_inventory(egpu(ref=ClaimRef("ns", "c", "uid-1")))
    assert not checked_against_inventory(egpu(phase=ElasticGPUPhase.BOUND))


def _claim() -> Claim:
    return Claim("ns", "c", "uid-1", None, {"elasticgpu.io/gpu-core": 20},
                      elastic_gpu_name="e")


@pytest.mark.parametrize("phase", [ElasticGPUPhase.PENDING, ElasticGPUPhase.FAILED])
@pytest.mark.parametrize("ref", [None, ClaimRef("ns", "c")])
def test_a_claim_never_binds_to_an_unchecked_or_failed_one(
        phase: ElasticGPUPhase, ref: ClaimRef | None) -> None:
    decision = decide(_claim(), {}, {"e": egpu(phase=phase, ref=ref)}, None)
    assert isinstance(decision, claim_decisions.Pending), decision
    assert decision.reason is PendingReason.ELASTICGPU_NOT_AVAILABLE


def test_a_claim_binds_to_a_checked_one_and_a_provisioned_one_is_not_held() -> None:
    available = egpu(phase=ElasticGPUPhase.AVAILABLE)
    assert isinstance(decide(_claim(), {}, {"e": available}, None), Bind)
    provisioned = egpu(ref=ClaimRef("ns", "c", "uid-1"))  # no status yet
    assert isinstance(decide(_claim(), {}, {"e": provisioned}, None), Bind)


def test_a_pre_bound_unchecked_one_is_kept_until_its_claim_comes() -> None:
    pending = egpu(ref=ClaimRef("ns", "c"))
    assert isinstance(decide_release(pending, None), Keep)
