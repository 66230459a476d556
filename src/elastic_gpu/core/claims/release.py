"""Reclaiming: what happens to an ElasticGPU once the claim it was bound to is gone (`Keep`,
`MarkReleased` under Retain, `DeleteElasticGPU` under Delete).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from elastic_gpu.core.claims.model import Claim, ElasticGPU, ElasticGPUPhase, ReclaimPolicy

# --------------------------------------------------------------------------- release


@dataclass(frozen=True)
class Keep:
    """Release decision: leave the ElasticGPU as it is (its claim still exists, it is already
    Released or Failed, it waits for a claim pre-bound by name, or its claim is gone but pods
    still use its cards: `waiting_for`)."""

    #: the pods (namespace/name) still using it, when that is why it is kept
    waiting_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class MarkReleased:
    """Retain: the ElasticGPU stays, holding its cards, phase Released, until deleted."""

    message: str


@dataclass(frozen=True)
class DeleteElasticGPU:
    """Delete: the ElasticGPU is deleted, and its cards freed with it."""

    message: str


ReleaseDecision = Keep | MarkReleased | DeleteElasticGPU


def decide_release(egpu: ElasticGPU, claim: Claim | None,
                   holders: Iterable[str] = ()) -> ReleaseDecision:
    """What to do with an ElasticGPU given the claim its claimRef names (None: no such claim,
    or one of another uid, i.e. deleted and re-created) and the pods still using its cards
    (`pods_holding`): never released nor deleted while one is left, whatever became of the
    claim."""
    ref = egpu.claim_ref
    if ref is None or egpu.phase in (ElasticGPUPhase.RELEASED, ElasticGPUPhase.FAILED):
        return Keep()
    if claim is not None and ref.matches(claim):
        return Keep()
    if not ref.uid and egpu.phase in (ElasticGPUPhase.AVAILABLE, ElasticGPUPhase.PENDING):
        return Keep()  # pre-bound by name to a claim not created yet
    waiting = tuple(sorted(holders))
    if waiting:
        return Keep(waiting)
    message = f"claim {ref.namespace}/{ref.name} was deleted"
    if egpu.reclaim_policy is ReclaimPolicy.DELETE:
        return DeleteElasticGPU(message)
    return MarkReleased(f"{message}; reclaim policy Retain: delete the ElasticGPU to free its cards")
