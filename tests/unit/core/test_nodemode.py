"""core.nodemode: what a DRA-mode node answers the extender's verbs, and the fit failures of
the checks that are not the engine's (claims, the node's mode)."""

from __future__ import annotations

from egpu_testing.claims import elasticgpu_object
from egpu_testing.workbench import pod_manifest
from elastic_gpu.api.elasticgpu import elasticgpu_from_object
from elastic_gpu.core.claims.blocks import BlockKind, ClaimBlock
from elastic_gpu.core.claims.pods import off_node_failure
from elastic_gpu.core.fit import FitFailure, FitKind, describe
from elastic_gpu.core.nodemode import DRA_MODE, Victims
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest

WHOLE = {"nvidia.com/gpu": "1"}
SHARE = {"elasticgpu.io/gpu-core": "30"}


def _request(limits: dict[str, str]) -> PodRequest:
    return pod_request_from_manifest(pod_manifest("p", limits=limits))


def test_a_dra_node_passes_whole_cards_and_leaves_the_fit_to_kube_scheduler() -> None:
    result = DRA_MODE.fit(_request(WHOLE), "u1", ["dra-b", "dra-a"], {})
    assert result.feasible == ["dra-a", "dra-b"] and result.failed == {}


def test_a_dra_node_refuses_a_share_with_one_dra_mode_failure_for_every_node() -> None:
    result = DRA_MODE.fit(_request(SHARE), "u1", ["dra-a", "dra-b"], {})
    assert result.feasible == []
    assert set(result.failed) == {"dra-a", "dra-b"}
    failure = result.failed["dra-a"]
    assert failure.kind is FitKind.DRA_NOT_SERVED
    assert (failure.node, failure.asked, failure.offered) == (
        "", ("elasticgpu.io/gpu-core",), ("nvidia.com/gpu",))
    # the node is the map's key; the failure (and so its sentence) is every node's
    assert result.failed["dra-b"] == failure and "dra-a" not in describe(failure)
    assert (failure.check, failure.category, failure.kind.unresolvable) == ("dra-mode", "dra", True)


def test_a_dra_node_refuses_a_pod_naming_claims_even_for_whole_cards() -> None:
    result = DRA_MODE.fit(_request(WHOLE), "u1", ["dra-a"], {"main": "c1"})
    assert result.feasible == []
    assert result.failed["dra-a"].kind is FitKind.DRA_NAMES_CLAIMS


def test_a_dra_node_scores_zero() -> None:
    assert DRA_MODE.score(_request(WHOLE), "u1", ["dra-b", "dra-a"]) == {"dra-a": 0, "dra-b": 0}


def test_a_dra_node_keeps_kube_schedulers_victims_only_where_the_pod_may_go() -> None:
    candidates: dict[str, Victims] = {"dra-a": (["victim"], 1)}
    assert DRA_MODE.may_preempt(_request(WHOLE), "u1", candidates, {}) == candidates
    assert DRA_MODE.may_preempt(_request(SHARE), "u1", candidates, {}) == {}


def test_a_dra_node_keeps_no_victims_for_a_pod_naming_claims_as_its_filter_refuses_it() -> None:
    candidates: dict[str, Victims] = {"dra-a": (["victim"], 1)}
    claims = {"main": "c1"}
    assert DRA_MODE.fit(_request(WHOLE), "u1", ["dra-a"], claims).feasible == []
    assert DRA_MODE.may_preempt(_request(WHOLE), "u1", candidates, claims) == {}


def test_engine_failures_are_the_engines_and_resolvable_but_an_unknown_node() -> None:
    engine = [k for k in FitKind if k.check == "engine"]
    assert FitKind.INSUFFICIENT_SHARE in engine and FitKind.UNKNOWN_NODE in engine
    assert [k for k in engine if k.unresolvable] == [FitKind.UNKNOWN_NODE]
    assert {k.check for k in FitKind} == {"engine", "claims", "dra-mode"}
    assert {k.category for k in FitKind if k.check == "claims"} == {"claim"}


def test_a_claim_bound_on_another_node_reads_as_the_extender_has_always_answered() -> None:
    egpu = elasticgpu_from_object(elasticgpu_object("egpu-u1", "n2", [],
                                                    claim=("default", "c1", "u1")))
    failure = off_node_failure("main", "default/c1", egpu)
    assert (failure.kind, failure.check, failure.category) == (
        FitKind.CLAIM_ON_OTHER_NODE, "claims", "claim")
    assert failure.kind.unresolvable
    assert describe(failure) == "ElasticGPUClaim default/c1 is bound to ElasticGPU egpu-u1 on node n2"


def test_blocked_claims_read_as_the_claims_own_reason() -> None:
    blocks = (ClaimBlock(BlockKind.MISSING, "default/c1"),
              ClaimBlock(BlockKind.BEING_BOUND, "default/c2", elastic_gpu="egpu-c2"))
    failure = FitFailure(FitKind.CLAIM_BLOCKED, claim_blocks=blocks)
    assert describe(failure) == ("ElasticGPUClaim default/c1 does not exist; ElasticGPUClaim "
                                 "default/c2 is Pending: not bound yet (ElasticGPU egpu-c2 is "
                                 "being bound to it)")
    assert failure.check == "claims" and failure.kind.unresolvable
