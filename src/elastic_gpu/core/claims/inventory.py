"""What an ElasticGPU holds: its cards as the assignment the scheduler's ledger counts (under
`ledger_key(name)`), and its check against the node's inventory of cards.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims.model import CLAIM_CONTAINER, ElasticGPU, ElasticGPUPhase

# --------------------------------------------------------------------------- the inventory


class InventoryReason(enum.Enum):
    """Why a pre-created ElasticGPU is `Failed`: its `status.reason`."""

    NODE_NOT_FOUND = "NodeNotFound"
    CARD_NOT_FOUND = "CardNotFound"
    UUID_MISMATCH = "UUIDMismatch"
    MIG_INSTANCE_NOT_FOUND = "MIGInstanceNotFound"


INVENTORY_REASONS = frozenset(r.value for r in InventoryReason)


@dataclass(frozen=True)
class InventoryCard:
    """What the GPUDevice inventory says of one card: its uuid and its MIG instances' uuids."""

    uuid: str
    mig_uuids: frozenset[str] = frozenset()


def checked_against_inventory(egpu: ElasticGPU) -> bool:
    """Whether `egpu` is checked against the inventory: one an administrator created (not
    pre-bound to one claim's uid, as the extender provisions them), until it is bound."""
    ref = egpu.claim_ref
    return (ref is None or not ref.uid) and egpu.phase in (
        ElasticGPUPhase.PENDING, ElasticGPUPhase.AVAILABLE, ElasticGPUPhase.FAILED)


def inventory_problem(egpu: ElasticGPU, inventory: Mapping[str, Mapping[int, InventoryCard]]
                      ) -> tuple[InventoryReason, str] | None:
    """Why a pre-created ElasticGPU does not name real cards (None: it does). `inventory`:
    node -> card index -> card, from the GPUDevices the agents publish. Its node must have
    GPUDevices, each card it names a GPUDevice at that index with that uuid, and each MIG
    instance it names one of that card's: an ElasticGPU naming card 999, a node that does not
    exist or another card's uuid would hand a pod a device that is not there, or someone
    else's."""
    where = f"ElasticGPU {egpu.name}"
    cards = inventory.get(egpu.node)
    if not cards:
        return (InventoryReason.NODE_NOT_FOUND,
                f"{where}: node {egpu.node!r} has no GPUDevice (no such node, or no agent "
                "reports its cards)")
    for share in egpu.shares:
        card = cards.get(share.index)
        if card is None:
            known = ", ".join(str(i) for i in sorted(cards))
            return (InventoryReason.CARD_NOT_FOUND,
                    f"{where}: node {egpu.node} has no card at index {share.index} "
                    f"(its cards: {known})")
        if share.uuid != card.uuid:
            return (InventoryReason.UUID_MISMATCH,
                    f"{where}: card {share.index} of node {egpu.node} is {card.uuid}, not "
                    f"{share.uuid}")
        if share.mig_uuid is not None and share.mig_uuid not in card.mig_uuids:
            return (InventoryReason.MIG_INSTANCE_NOT_FOUND,
                    f"{where}: card {share.index} of node {egpu.node} has no MIG instance "
                    f"{share.mig_uuid}")
    return None


# --------------------------------------------------------------------------- ledger


def ledger_key(egpu_name: str) -> str:
    """The engine-ledger key of an ElasticGPU (never a pod key: those are namespace/name)."""
    return f"elasticgpu:{egpu_name}"


def egpu_assignment(egpu: ElasticGPU) -> Assignment:
    """The cards an ElasticGPU holds, as the assignment the scheduler's ledger counts. Released
    ones hold their cards too (Retain); only deletion frees them."""
    return Assignment(egpu.node, {CLAIM_CONTAINER: egpu.shares})
