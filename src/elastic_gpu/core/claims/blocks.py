"""Why a pod's ElasticGPUClaims keep it off every node now, typed: `ClaimBlock`s, made by
`core.claims.pods.resolve_pod_claims` and turned into a sentence once, at the edge
(`describe_blocks`, which `core.fit.describe` calls for the extender's answers and the
binder's errors), as a fit failure is. Code that acts on a block reads its `kind`, never the
text. Imports nothing of the claims' own, so that `core.fit` may import it."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class BlockKind(enum.Enum):
    """What keeps the pod off every node."""

    #: the claim the pod names does not exist
    MISSING = "missing"
    #: the claim is being deleted
    DELETING = "deleting"
    #: the claim is Pending (or Lost): `message`, the binding decision's reason
    PENDING = "pending"
    #: its class provisions it when the claim is created (`provisioner`): not bound yet
    NOT_PROVISIONED = "not-provisioned"
    #: an ElasticGPU (`elastic_gpu`) is being bound to it
    BEING_BOUND = "being-bound"
    #: an unbound WaitForFirstConsumer claim named by several `containers` of the pod
    FIRST_CONSUMER_SHARED = "first-consumer-shared"
    #: the pod's claims are bound to ElasticGPUs on different nodes (`placements`)
    SPLIT_NODES = "split-nodes"


@dataclass(frozen=True)
class ClaimBlock:
    """One reason the pod's claims cannot be placed; fields a kind does not use keep their
    defaults."""

    kind: BlockKind
    #: the claim, namespace/name (every kind but SPLIT_NODES)
    claim: str = ""
    #: PENDING: why, as the claim's binding decision says (`core.claims.binding`)
    message: str = ""
    #: NOT_PROVISIONED: the class's provisioner
    provisioner: str = ""
    #: BEING_BOUND: the ElasticGPU being bound to the claim
    elastic_gpu: str = ""
    #: FIRST_CONSUMER_SHARED: the containers naming the claim
    containers: tuple[str, ...] = ()
    #: SPLIT_NODES: (container, ElasticGPU, its node) of every bound container
    placements: tuple[tuple[str, str, str], ...] = ()


def describe_block(block: ClaimBlock) -> str:
    """The one sentence of a block."""
    kind, claim = block.kind, block.claim
    if kind is BlockKind.MISSING:
        return f"ElasticGPUClaim {claim} does not exist"
    if kind is BlockKind.DELETING:
        return f"ElasticGPUClaim {claim} is being deleted"
    if kind is BlockKind.PENDING:
        return f"ElasticGPUClaim {claim} is Pending: {block.message}"
    if kind is BlockKind.NOT_PROVISIONED:
        return (f"ElasticGPUClaim {claim} is Pending: not bound yet; its class provisions it "
                f"when the claim is created ({block.provisioner})")
    if kind is BlockKind.BEING_BOUND:
        return (f"ElasticGPUClaim {claim} is Pending: not bound yet (ElasticGPU "
                f"{block.elastic_gpu} is being bound to it)")
    if kind is BlockKind.FIRST_CONSUMER_SHARED:
        return (f"ElasticGPUClaim {claim} (WaitForFirstConsumer) is named by containers "
                f"{', '.join(block.containers)}; until it is bound, one container of a pod "
                "may name it")
    assert kind is BlockKind.SPLIT_NODES
    return ("the pod's claims are bound to ElasticGPUs on different nodes ("
            + ", ".join(f"{c}: {e} on {n}" for c, e, n in block.placements)
            + "); a pod runs on one node")


def describe_blocks(blocks: Iterable[ClaimBlock]) -> str:
    """Every block's sentence, in order, as one reason."""
    return "; ".join(describe_block(b) for b in blocks)
