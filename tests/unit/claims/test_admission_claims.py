"""Admission of pods that name ElasticGPUClaims (issue #15): each refusal, and the mutation
that gives a claim's container the claim's resources under the names the agent advertises."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_testing.seed import seed_pod
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.claim_plan import (
    CLAIM_RESOURCE_NAMES,
    PodClaims,
    claim_container_resources,
    claim_names,
)
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.admission.rules import AdmissionRule, describe
from elastic_gpu.core.claims.model import GPUSHARE, MIG, WHOLE_CARDS, Claim
from elastic_gpu.core.claims.provisioning import PROVISIONERS
from elastic_gpu.core.request import RequestKind, container_request
from elastic_gpu.core.resources import RESOURCE_TABLE, Measure, ResourceError

FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big")
SEED_REQUESTS: dict[str, int | str] = {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                                       "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}


def claim(name: str = "gpushare-egpuc-1", requests: dict[str, int | str] | None = None, *,
          namespace: str = "default", deleting: bool = False) -> Claim:
    return Claim(namespace, name, f"uid-{name}", "gpushare-egpuclass",
                 SEED_REQUESTS if requests is None else requests, deleting=deleting)


def found(*claims: Claim, namespace: str = "default") -> PodClaims:
    return PodClaims(namespace, {c.name: c for c in claims})


def the_seed_pod(claim_name: str = "gpushare-egpuc-1") -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load(seed_pod("test-cuda-1", claim_name))
    pod["metadata"]["namespace"] = "default"
    return pod


def pod_with(containers: list[dict[str, Any]], annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
            "spec": {"containers": containers}}


def mutated(pod: dict[str, Any], claims: PodClaims, facts: ClusterFacts = FACTS
            ) -> dict[str, Any]:
    verdict = admit(pod, facts, mutate=True, claims=claims)
    assert verdict.allowed, verdict.message
    out: dict[str, Any] = apply_patch(pod, verdict.patch)
    return out


# --- the seed README's pod --------------------------------------------------------------------

def test_the_seed_readme_pod_gets_its_claims_share_under_the_agents_names() -> None:
    pod = the_seed_pod()
    verdict = admit(pod, FACTS, mutate=True, claims=found(claim()))
    assert verdict.allowed and verdict.gpu
    wanted = {"elasticgpu.io/gpu-core": "10", "elasticgpu.io/gpu-memory": "4"}
    assert list(verdict.patch) == [{"op": "add", "path": "/spec/containers/0/resources",
                                    "value": {"limits": wanted, "requests": wanted}}]
    stored = apply_patch(pod, verdict.patch)
    request = container_request("test-cuda", stored["spec"]["containers"][0]["resources"])
    assert (request.kind, request.compute_milli, request.memory_mib) == (RequestKind.SHARE, 100, 4)


def test_a_pod_naming_a_missing_claim_is_refused_with_the_annotation_and_namespace() -> None:
    verdict = admit(the_seed_pod("nope"), FACTS, mutate=True, claims=found(claim()))
    assert not verdict.allowed and not verdict.patch
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_NOT_FOUND]
    assert verdict.message == (
        "container test-cuda: egpuc.elasticgpu.io/test1=nope: ElasticGPUClaim nope does not "
        "exist in namespace default; create it first (rule claim-not-found)")


def test_without_a_lookup_every_named_claim_counts_as_missing() -> None:
    verdict = admit(the_seed_pod(), FACTS, mutate=True)
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_NOT_FOUND]


def test_a_claim_of_another_namespace_does_not_count() -> None:
    pod = the_seed_pod()
    pod["metadata"]["namespace"] = "team-b"
    verdict = admit(pod, FACTS, mutate=True, claims=PodClaims("team-b", {}))
    assert "does not exist in namespace team-b" in verdict.message


def test_a_claim_being_deleted_is_refused() -> None:
    verdict = admit(the_seed_pod(), FACTS, mutate=True, claims=found(claim(deleting=True)))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_DELETING]
    assert "ElasticGPUClaim gpushare-egpuc-1 in namespace default is being deleted" in \
        verdict.message


@pytest.mark.parametrize("own", [{"nvidia.com/gpu": "1"}, {"elasticgpu.io/gpu-core": "50"},
                                 {"elasticgpu.io/gpu-core": "10"},  # part of the claim's only
                                 {"nvidia.com/mig-abc": "1"}])
def test_a_claim_container_asking_gpus_of_its_own_is_refused(own: dict[str, str]) -> None:
    pod = the_seed_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": dict(own)}
    if own == {"elasticgpu.io/gpu-core": "10"}:  # the claim's value, plus another name
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    verdict = admit(pod, FACTS, mutate=True, claims=found(claim()))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_CONTAINER_GPU]
    refusal = verdict.refusals[0]
    assert refusal.container == "test-cuda"
    assert "gets its GPUs from ElasticGPUClaim gpushare-egpuc-1" in describe(refusal)


def test_cpu_and_memory_of_a_claim_container_are_kept() -> None:
    pod = the_seed_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"},
                                                 "requests": {"cpu": "500m", "memory": "1Gi"}}
    stored = mutated(pod, found(claim()))
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "1", "elasticgpu.io/gpu-core": "10",
                                   "elasticgpu.io/gpu-memory": "4"}
    assert resources["requests"] == {"cpu": "500m", "memory": "1Gi",
                                     "elasticgpu.io/gpu-core": "10",
                                     "elasticgpu.io/gpu-memory": "4"}


# --- whole cards, MIG, memory only, several containers ----------------------------------------

@pytest.mark.parametrize(("requests", "wanted"), [
    ({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": "2"}),
    ({"elasticgpu.io/gpu": 1}, {"nvidia.com/gpu": "1"}),
    ({"elasticgpu.io/gpu-core": 200}, {"nvidia.com/gpu": "2"}),
    ({"nvidia.com/gpu": 1, "elasticgpu.io/gpu-memory": "40k"},
     {"nvidia.com/gpu": "1", "elasticgpu.io/gpu-memory": "40000"}),
    ({"nvidia.com/mig-1g.10gb": 2}, {"nvidia.com/mig-1g.10gb": "2"}),
    ({"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 4},
     {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "1024"}),
    ({"nano-gpu/gpu-percent": 25}, {"elasticgpu.io/gpu-core": "25"}),
])
def test_whole_card_mig_and_alias_claims_become_the_agents_resources(
        requests: dict[str, int | str], wanted: dict[str, str]) -> None:
    stored = mutated(the_seed_pod(), found(claim(requests=requests)))
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources == {"limits": wanted, "requests": wanted}


def test_a_memory_only_claim_also_gets_one_compute_device_so_kubelet_calls_the_agent() -> None:
    stored = mutated(the_seed_pod(), found(claim(requests={
        "gpushare.provisioner.elasticgpu.io/gpu-memory": 2048})))
    wanted = {"elasticgpu.io/gpu-memory": "2048", "elasticgpu.io/gpu-core": "1"}
    assert stored["spec"]["containers"][0]["resources"] == {"limits": wanted,
                                                            "requests": wanted}


def test_several_containers_naming_several_claims() -> None:
    pod = pod_with([{"name": "train", "image": "x"}, {"name": "infer", "image": "x"},
                    {"name": "sidecar", "image": "x", "resources": {"limits": {"cpu": "1"}}}],
                   {"egpuc.elasticgpu.io/train": "c-whole", "egpuc.elasticgpu.io/infer": "c-share"})
    claims = found(claim("c-whole", {"nvidia.com/gpu": 2}),
                   claim("c-share", SEED_REQUESTS))
    assert claim_names(pod) == {"c-whole", "c-share"}
    stored = mutated(pod, claims)
    train, infer, sidecar = stored["spec"]["containers"]
    assert train["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert infer["resources"]["limits"] == {"elasticgpu.io/gpu-core": "10",
                                            "elasticgpu.io/gpu-memory": "4"}
    assert sidecar["resources"] == {"limits": {"cpu": "1"}}


def test_one_claim_named_by_two_containers_gives_both_its_resources() -> None:
    pod = pod_with([{"name": "a", "image": "x"}, {"name": "b", "image": "x"}],
                   {"egpuc.elasticgpu.io/a": "c", "egpuc.elasticgpu.io/b": "c"})
    stored = mutated(pod, found(claim("c")))
    assert [c["resources"]["limits"]["elasticgpu.io/gpu-core"]
            for c in stored["spec"]["containers"]] == ["10", "10"]


def test_an_annotation_naming_no_container_of_a_multi_container_pod_is_refused() -> None:
    pod = pod_with([{"name": "a", "image": "x"}, {"name": "b", "image": "x"}],
                   {"egpuc.elasticgpu.io/test1": "c"})
    verdict = admit(pod, FACTS, mutate=True, claims=found(claim("c")))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_ANNOTATION]
    assert "egpuc.elasticgpu.io/test1=c" in verdict.message and "none is named 'test1'" in \
        verdict.message
    assert claim_names(pod) == frozenset()


def _with_init(pod: dict[str, Any], init: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["initContainers"] = [{"name": "setup", "image": "x"}, init]
    return pod


def test_a_sidecar_may_name_a_claim_and_gets_its_resources() -> None:
    """A sidecar (an init container with restartPolicy Always) runs for the pod's life, as a
    regular container does: it may use a claim, and gets the claim's resources where it is
    written (`/spec/initContainers/1`)."""
    pod = _with_init(pod_with([{"name": "main", "image": "x"}],
                              {"egpuc.elasticgpu.io/proxy": "c"}),
                     {"name": "proxy", "image": "x", "restartPolicy": "Always"})
    assert claim_names(pod) == {"c"}
    stored = mutated(pod, found(claim("c")))
    setup, proxy = stored["spec"]["initContainers"]
    assert proxy["resources"]["limits"] == {"elasticgpu.io/gpu-core": "10",
                                            "elasticgpu.io/gpu-memory": "4"}
    assert proxy["resources"]["requests"] == proxy["resources"]["limits"]
    assert "resources" not in setup and "resources" not in stored["spec"]["containers"][0]


def test_a_sidecar_naming_a_claim_and_asking_its_own_gpu_is_refused_naming_the_claim() -> None:
    pod = _with_init(pod_with([{"name": "main", "image": "x"}],
                              {"egpuc.elasticgpu.io/proxy": "c"}),
                     {"name": "proxy", "image": "x", "restartPolicy": "Always",
                      "resources": {"limits": {"elasticgpu.io/gpu-core": "20"}}})
    verdict = admit(pod, FACTS, mutate=True, claims=found(claim("c")))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_CONTAINER_GPU]
    assert "container proxy gets its GPUs from ElasticGPUClaim c" in verdict.message


def test_a_classic_init_container_naming_a_claim_is_refused_with_the_reason() -> None:
    pod = _with_init(pod_with([{"name": "main", "image": "x"}],
                              {"egpuc.elasticgpu.io/setup": "c"}),
                     {"name": "proxy", "image": "x", "restartPolicy": "Always"})
    verdict = admit(pod, FACTS, mutate=True, claims=found(claim("c")))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_ANNOTATION]
    assert ("setup is an init container that runs to completion before the pod's containers "
            "start") in verdict.message
    assert "sidecar" in verdict.message


def test_a_claim_annotation_that_is_not_a_name_is_refused() -> None:
    verdict = admit(the_seed_pod("Not_A_Name"), FACTS, mutate=True)
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_ANNOTATION]
    assert "DNS subdomain" in verdict.message


# --- a claim's request meets the other rules --------------------------------------------------

def test_a_claims_request_above_the_largest_node_is_refused_with_the_rule_and_the_claim() -> None:
    verdict = admit(the_seed_pod(), FACTS, mutate=True,
                    claims=found(claim(requests={"nvidia.com/gpu": 9})))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.EXCEEDS_LARGEST_NODE]
    assert verdict.message == (
        "container test-cuda: nvidia.com/gpu=9 cards: no node could ever hold it: the largest "
        "node, big, has 8 cards (its GPU resources come from ElasticGPUClaim "
        "default/gpushare-egpuc-1) (rule exceeds-largest-node)")


def test_a_claims_value_breaking_its_row_is_refused_naming_the_claim() -> None:
    verdict = admit(the_seed_pod(), FACTS, mutate=True, claims=found(claim(requests={
        "gpushare.provisioner.elasticgpu.io/gpu-core": 150})))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.RESOURCE_VALUE]
    assert "gpushare.provisioner.elasticgpu.io/gpu-core=150" in verdict.message
    assert "in the requests of ElasticGPUClaim gpushare-egpuc-1" in verdict.message


def test_a_claim_asking_for_no_gpu_is_refused() -> None:
    verdict = admit(the_seed_pod(), FACTS, mutate=True, claims=found(claim(requests={
        "elasticgpu.io/gpu-memory": 0})))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.CLAIM_REQUEST]


def test_a_claim_asking_one_measure_twice_is_refused() -> None:
    verdict = admit(the_seed_pod(), FACTS, mutate=True, claims=found(claim(requests={
        "elasticgpu.io/gpu-core": 10, "gpushare.provisioner.elasticgpu.io/gpu-core": 10})))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.ONE_MEASURE]


# --- reinvocation and the validating call -----------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(core=st.integers(1, 99), memory=st.integers(0, 81920), cards=st.integers(1, 8),
       kind=st.sampled_from(["share", "whole", "mig"]), with_limits=st.booleans())
def test_a_mutated_pod_is_admitted_unchanged(core: int, memory: int, cards: int, kind: str,
                                             with_limits: bool) -> None:
    requests: dict[str, int | str] = (
        {"gpushare.provisioner.elasticgpu.io/gpu-core": core,
         "gpushare.provisioner.elasticgpu.io/gpu-memory": memory} if kind == "share" else
        {"nvidia.com/gpu": cards} if kind == "whole" else {"nvidia.com/mig-3g.40gb": cards})
    pod = the_seed_pod()
    if with_limits:
        pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    claims = found(claim(requests=requests))
    once = mutated(pod, claims)
    again = admit(once, FACTS, mutate=True, claims=claims)
    assert again.allowed and list(again.patch) == []
    assert admit(once, FACTS, claims=claims).allowed  # the validating call


# --- the translation, for every row of the resource table -------------------------------------

@pytest.mark.parametrize("spec", RESOURCE_TABLE, ids=lambda s: s.name)
def test_every_table_name_translates_to_a_request_meaning_the_same(spec: Any) -> None:
    value = {Measure.COMPUTE: 40, Measure.MEMORY: 3, Measure.CARDS: 2,
             Measure.TFLOPS: 100}[spec.measure]
    written = {spec.name: value}
    translated = claim_container_resources(written)
    assert set(translated) <= set(CLAIM_RESOURCE_NAMES.values())
    before = container_request("c", {"limits": written})
    after = container_request("c", {"limits": translated})
    assert (after.kind, after.cards, after.compute_milli, after.memory_mib, after.tflops) == \
        (before.kind, before.cards, before.compute_milli, before.memory_mib, before.tflops)


def test_a_value_breaking_its_row_raises_with_resource_value_and_rule() -> None:
    with pytest.raises(ResourceError, match=r"gpu-core=150: an integer 1-99"):
        claim_container_resources({"gpushare.provisioner.elasticgpu.io/gpu-core": 150})


@pytest.mark.parametrize(("provisioner", "requests"), [
    (GPUSHARE, SEED_REQUESTS), (WHOLE_CARDS, {"nvidia.com/gpu": 2}),
    (MIG, {"nvidia.com/mig-3g.40gb": 1})])
def test_each_provisioners_claims_become_resources_the_sandboxs_fake_nodes_offer(
        provisioner: str, requests: dict[str, int | str]) -> None:
    """The names a claim becomes are what the agent's default configuration (the sandbox's
    fake nodes) advertises, and what kube-scheduler hands to the extender."""
    from elastic_gpu.devcluster.nodes import fake_inventory, node_capacity, parse_cluster
    from elastic_gpu.scheduler.schedconfig import managed_resource_names

    PROVISIONERS[provisioner].container(claim(requests=requests))  # a claim of that kind
    plain = node_capacity(fake_inventory("a", gpus=2))
    carved = node_capacity(parse_cluster({"nodeGroups": [{
        "name": "m", "count": 1, "gpus": 1, "mig": ["3g.40gb", "3g.40gb"]}]})[0].inventories()[0])
    for name in claim_container_resources(requests):
        assert name in plain or name in carved
        assert name in managed_resource_names()


def test_the_claim_mutator_also_works_placed_after_another() -> None:
    """`admit` reuses validation's claim operations only when the claim mutator comes first;
    placed after another mutator it is run on the pod as that one left it."""
    from elastic_gpu.core.admission.chain import MUTATORS
    from elastic_gpu.core.admission.jsonpatch import set_annotation
    from elastic_gpu.core.admission.mutators.claims import claim_resources

    def mark(data: Any) -> list[dict[str, Any]]:
        annotations = data.pod["metadata"].get("annotations") or {}
        return [] if "x/mark" in annotations else [set_annotation(data.pod, "x/mark", "1")]

    pod = the_seed_pod()
    claims = found(claim())
    for mutators in ((mark, *MUTATORS), (mark, claim_resources), MUTATORS):
        verdict = admit(pod, FACTS, mutate=True, claims=claims, mutators=mutators)
        stored = apply_patch(pod, verdict.patch)
        assert stored["spec"]["containers"][0]["resources"]["limits"] == {
            "elasticgpu.io/gpu-core": "10", "elasticgpu.io/gpu-memory": "4"}
        assert ("x/mark" in stored["metadata"]["annotations"]) == (mark in mutators)
