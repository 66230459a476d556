"""Why a pod's claims keep it off every node is typed (`core.claims.blocks.ClaimBlock`) and
made into a sentence once, at the edge (`describe_blocks`, through `core.fit.describe`)."""

from __future__ import annotations

from elastic_gpu.core.claims.blocks import BlockKind, ClaimBlock, describe_block, describe_blocks
from elastic_gpu.core.claims.pods import resolve_pod_claims
from elastic_gpu.core.fit import FitFailure, FitKind, describe


def test_a_missing_claim_is_a_typed_block_that_waits_for_the_claim() -> None:
    view = resolve_pod_claims("team-a", {"main": "c1", "tool": "c2"}, {}, {}, {})
    assert view.blocked == (ClaimBlock(BlockKind.MISSING, "team-a/c1"),
                            ClaimBlock(BlockKind.MISSING, "team-a/c2"))
    assert view.waits_for == {"team-a/c1", "team-a/c2"}
    assert describe_blocks(view.blocked) == ("ElasticGPUClaim team-a/c1 does not exist; "
                                             "ElasticGPUClaim team-a/c2 does not exist")


def test_no_claims_named_no_block() -> None:
    assert resolve_pod_claims("team-a", {}, {}, {}, {}).blocked == ()


def test_every_kind_has_its_sentence_and_fit_describe_makes_it() -> None:
    blocks = {
        BlockKind.MISSING: ClaimBlock(BlockKind.MISSING, "ns/c"),
        BlockKind.DELETING: ClaimBlock(BlockKind.DELETING, "ns/c"),
        BlockKind.PENDING: ClaimBlock(BlockKind.PENDING, "ns/c", message="no class"),
        BlockKind.NOT_PROVISIONED: ClaimBlock(BlockKind.NOT_PROVISIONED, "ns/c",
                                              provisioner="elasticgpu.io/provisioner"),
        BlockKind.BEING_BOUND: ClaimBlock(BlockKind.BEING_BOUND, "ns/c", elastic_gpu="e1"),
        BlockKind.FIRST_CONSUMER_SHARED: ClaimBlock(BlockKind.FIRST_CONSUMER_SHARED, "ns/c",
                                                    containers=("a", "b")),
        BlockKind.SPLIT_NODES: ClaimBlock(BlockKind.SPLIT_NODES, placements=(
            ("a", "e1", "n1"), ("b", "e2", "n2"))),
    }
    assert set(blocks) == set(BlockKind)
    assert describe_block(blocks[BlockKind.SPLIT_NODES]) == (
        "the pod's claims are bound to ElasticGPUs on different nodes (a: e1 on n1, b: e2 on "
        "n2); a pod runs on one node")
    for block in blocks.values():
        text = describe(FitFailure(FitKind.CLAIM_BLOCKED, claim_blocks=(block,)))
        assert text == describe_block(block) and text and "None" not in text
