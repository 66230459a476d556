"""Admission's pure decisions: one test (or parametrized case) per rule, the mutations, and
idempotence under reinvocation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import MUTATORS
from elastic_gpu.core.admission.facts import (
    ClusterFacts,
    NodeGpus,
    default_policies,
    facts_from_nodes,
    node_gpus,
)
from elastic_gpu.core.admission.jsonpatch import apply_patch, pointer
from elastic_gpu.core.admission.rules import VCUDA_CORE_LIMIT, AdmissionRule, describe
from elastic_gpu.core.nodefit import NODE_CORE

NODE_POLICIES, CARD_POLICIES = default_policies()
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big", models=frozenset({"A100-SXM4-80GB"}),
                     node_policies=NODE_POLICIES, card_policies=CARD_POLICIES)


def node_ops(index: int, value: str, *, requests: bool = True) -> list[dict[str, Any]]:
    """The webhook's node-level GPU count (`core.nodefit`) on container `index`."""
    return [{"op": "add", "path": pointer("spec", "containers", index, "resources", part, NODE_CORE),
             "value": value} for part in (("limits", "requests") if requests else ("limits",))]


def pod(limits: dict[str, Any] | None = None, *, annotations: dict[str, str] | None = None,
        init_limits: dict[str, Any] | None = None, requests: bool = True,
        containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
        if requests:
            resources["requests"] = dict(limits)
    spec: dict[str, Any] = {"containers": containers or [
        {"name": "main", "image": "x", "resources": resources}]}
    if init_limits is not None:
        spec["initContainers"] = [{"name": "setup", "image": "x",
                                   "resources": {"limits": init_limits}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def rules(verdict: Any) -> list[AdmissionRule]:
    return [r.rule for r in verdict.refusals]


# --- the gpusharing seed pod and the must-show refusals -----------------------------------

def test_the_gpusharing_seed_pod_is_allowed_with_gpu_managers_limit_annotation() -> None:
    seed = pod({"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "15"})
    verdict = admit(seed, FACTS, mutate=True)
    assert verdict.allowed and verdict.gpu
    assert list(verdict.patch) == [{"op": "add", "path": "/metadata/annotations",
                                    "value": {VCUDA_CORE_LIMIT: "50"}}, *node_ops(0, "50")]


@pytest.mark.parametrize(("resource", "value", "rule", "words"), [
    ("tencent.com/vcuda-core", "150", AdmissionRule.RESOURCE_VALUE, "1-99"),
    ("tencent.com/vcuda-core", "0", AdmissionRule.RESOURCE_VALUE, "multiple of 100"),
    ("tencent.com/vcuda-core", "-5", AdmissionRule.RESOURCE_VALUE, "no sign"),
    ("tencent.com/vcuda-core", "1500m", AdmissionRule.RESOURCE_VALUE, "fraction"),  # 1.5
    ("tencent.com/vcuda-core", 1.5, AdmissionRule.RESOURCE_VALUE, "1-99"),
    ("tencent.com/vcuda-memory", "1Gi", AdmissionRule.RESOURCE_VALUE, "256 MiB"),
    ("nano-gpu/gpu-percent", "101", AdmissionRule.RESOURCE_VALUE, "1-99"),
    ("elasticgpu.io/gpu-core", "250", AdmissionRule.RESOURCE_VALUE, "multiple of 100"),
    ("elasticgpu.io/gpu-memory", "-1", AdmissionRule.RESOURCE_VALUE, "no sign"),
    ("nvidia.com/gpu", "0", AdmissionRule.RESOURCE_VALUE, "positive"),
    ("nvidia.com/mig-3g.abc", "1", AdmissionRule.MIG_PROFILE, "3g.40gb"),
    ("nvidia.com/mig-8g.40gb", "1", AdmissionRule.MIG_PROFILE, "1-7 compute slices"),
])
def test_each_resource_rule_refuses_naming_container_resource_value_and_rule(
        resource: str, value: Any, rule: AdmissionRule, words: str) -> None:
    verdict = admit(pod({resource: value}), FACTS, mutate=True)
    assert rules(verdict) == [rule]
    (refusal,) = verdict.refusals
    assert refusal.container == "main"
    assert resource in refusal.resource
    message = verdict.message
    assert message.startswith("container main: ") and resource in message
    assert words in message and f"(rule {rule.value})" in message
    if rule is AdmissionRule.RESOURCE_VALUE:
        assert repr(value) in message
    assert verdict.patch == ()


def test_more_whole_cards_than_the_largest_node_is_refused_saying_the_largest() -> None:
    verdict = admit(pod({"nvidia.com/gpu": "9"}), FACTS)
    assert rules(verdict) == [AdmissionRule.EXCEEDS_LARGEST_NODE]
    assert "largest node, big, has 8 cards" in verdict.message
    assert "container main" in verdict.message and "9 cards" in verdict.message
    assert admit(pod({"nvidia.com/gpu": "8"}), FACTS).allowed
    assert admit(pod({"tencent.com/vcuda-core": "900"}), FACTS).refusals  # 9 cards as compute


def test_cards_summed_over_containers_count_against_the_largest_node() -> None:
    two = pod(containers=[
        {"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "5"}}} for i in range(2)])
    verdict = admit(two, FACTS)
    assert rules(verdict) == [AdmissionRule.EXCEEDS_LARGEST_NODE]
    assert "10 cards in all containers" in verdict.message


def test_more_memory_than_any_card_is_refused() -> None:
    verdict = admit(pod({"elasticgpu.io/gpu-memory": "90000"}), FACTS)
    assert rules(verdict) == [AdmissionRule.EXCEEDS_CARD_MEMORY]
    assert "81920 MiB" in verdict.message and "elasticgpu.io/gpu-memory" in verdict.message


def test_without_known_gpu_nodes_capacity_is_not_checked() -> None:
    assert admit(pod({"nvidia.com/gpu": "64"}), ClusterFacts()).allowed


def test_one_measure_per_container() -> None:
    verdict = admit(pod({"tencent.com/vcuda-core": "20", "elasticgpu.io/gpu-core": "20"}), FACTS)
    assert rules(verdict) == [AdmissionRule.ONE_MEASURE]
    assert "compute twice" in verdict.message
    both = admit(pod({"nvidia.com/gpu": "1", "elasticgpu.io/gpu-core": "20"}), FACTS)
    assert rules(both) == [AdmissionRule.ONE_MEASURE]
    mig = admit(pod({"nvidia.com/mig-1g.10gb": "1", "elasticgpu.io/gpu-memory": "10"}), FACTS)
    assert rules(mig) == [AdmissionRule.ONE_MEASURE]


def test_gpu_in_an_init_container_is_refused() -> None:
    verdict = admit(pod({"nvidia.com/gpu": "1"}, init_limits={"nvidia.com/gpu": "1"}), FACTS)
    assert rules(verdict) == [AdmissionRule.INIT_CONTAINER_GPU]
    assert verdict.message.startswith("init container setup: nvidia.com/gpu")


def test_bad_value_in_an_init_container_names_it() -> None:
    verdict = admit(pod(init_limits={"tencent.com/vcuda-core": "150"}), FACTS)
    assert verdict.refusals[0].init_container
    assert verdict.message.startswith("init container setup:")


@pytest.mark.parametrize(("key", "value", "rule"), [
    ("elasticgpu.io/node-policy", "fastest", AdmissionRule.UNKNOWN_POLICY),
    ("elasticgpu.io/card-policy", "nope", AdmissionRule.UNKNOWN_POLICY),
    ("elasticgpu.io/gpu-model", "T4|V100", AdmissionRule.UNKNOWN_MODEL),
    ("elasticgpu.io/gpu-model", " | ", AdmissionRule.BAD_ANNOTATION),
    ("elasticgpu.io/gpu-model-deny", ",", AdmissionRule.BAD_ANNOTATION),
    (VCUDA_CORE_LIMIT, "150", AdmissionRule.BAD_ANNOTATION),
])
def test_annotations_the_scheduler_reads_with_unknown_values(
        key: str, value: str, rule: AdmissionRule) -> None:
    verdict = admit(pod({"nvidia.com/gpu": "1"}, annotations={key: value}), FACTS)
    assert rules(verdict) == [rule]
    assert key in verdict.message and repr(value) in verdict.message


def test_known_annotation_values_pass() -> None:
    node, card = sorted(NODE_POLICIES)[0], sorted(CARD_POLICIES)[0]
    verdict = admit(pod({"nvidia.com/gpu": "1"}, annotations={
        "elasticgpu.io/node-policy": node, "elasticgpu.io/card-policy": card,
        "elasticgpu.io/gpu-model": "H100|A100-SXM4-80GB"}), FACTS)
    assert verdict.allowed


def test_malformed_pods_are_refused_not_crashed() -> None:
    for bad in (None, [], "pod", {"spec": []}, {"spec": {"containers": {}}},
                {"spec": {"containers": [1]}}, {"metadata": {"annotations": {"a": 1}}},
                {"spec": {"containers": [{"name": "m", "resources": {"limits": []}}]}},
                {"spec": {"containers": [{"name": "m", "resources": {"limits": {
                    "cpu": ["1"], "nvidia.com/gpu": "1"}}}]}}):
        verdict = admit(bad, FACTS, mutate=True)
        assert not verdict.allowed, bad
        assert verdict.message


def test_pods_without_gpus_are_allowed_unchanged() -> None:
    verdict = admit(pod({"cpu": "1"}), FACTS, mutate=True)
    assert verdict.allowed and not verdict.gpu and verdict.patch == ()


# --- mutations ----------------------------------------------------------------------------

def test_memory_only_share_gets_one_compute_device_so_kubelet_allocates() -> None:
    p = pod({"elasticgpu.io/gpu-memory": "4096"})
    verdict = admit(p, FACTS, mutate=True)
    assert set(map(str, (op["path"] for op in verdict.patch))) == {
        "/spec/containers/0/resources/limits/elasticgpu.io~1gpu-core",
        "/spec/containers/0/resources/requests/elasticgpu.io~1gpu-core",
        *(op["path"] for op in node_ops(0, "1"))}
    patched = apply_patch(p, verdict.patch)
    assert patched["spec"]["containers"][0]["resources"]["limits"]["elasticgpu.io/gpu-core"] == "1"
    # the one percent it holds is what kube-scheduler counts at node level
    assert patched["spec"]["containers"][0]["resources"]["limits"][NODE_CORE] == "1"
    assert admit(patched, FACTS, mutate=True).patch == ()  # reinvocation: nothing more


def test_memory_only_vcuda_memory_is_a_device_plugin_and_left_alone() -> None:
    verdict = admit(pod({"tencent.com/vcuda-memory": "16"}), FACTS, mutate=True)
    assert verdict.allowed and verdict.patch == ()


def test_vcuda_core_limit_kept_when_set_and_added_next_to_other_annotations() -> None:
    kept = admit(pod({"tencent.com/vcuda-core": "30"}, annotations={VCUDA_CORE_LIMIT: "20"}),
                 FACTS, mutate=True)
    assert kept.allowed and list(kept.patch) == node_ops(0, "30")  # the annotation is kept
    added = admit(pod({"tencent.com/vcuda-core": "30"}, annotations={"a": "b"}), FACTS, mutate=True)
    assert list(added.patch) == [{"op": "add", "path": pointer("metadata", "annotations",
                                                               VCUDA_CORE_LIMIT), "value": "30"},
                                 *node_ops(0, "30")]


def test_vcuda_whole_cards_and_disagreeing_shares_get_no_limit() -> None:
    # no annotation: only the node-level count
    assert list(admit(pod({"tencent.com/vcuda-core": "200"}), FACTS, mutate=True).patch) == \
        node_ops(0, "200")
    two = pod(containers=[{"name": f"c{i}", "resources": {"limits": {
        "tencent.com/vcuda-core": str(10 + i)}}} for i in range(2)])
    assert list(admit(two, FACTS, mutate=True).patch) == [
        *node_ops(0, "10", requests=False), *node_ops(1, "11", requests=False)]


def test_the_validating_call_never_patches() -> None:
    assert admit(pod({"elasticgpu.io/gpu-memory": "4096"}), FACTS).patch == ()


def test_mutators_see_each_others_changes() -> None:
    def first(data: Any) -> list[dict[str, Any]]:
        return [] if "x" in (data.pod["metadata"].get("annotations") or {}) else [
            {"op": "add", "path": "/metadata/annotations", "value": {"x": "1"}}]

    def second(data: Any) -> list[dict[str, Any]]:
        assert data.pod["metadata"]["annotations"]["x"] == "1"
        return [{"op": "add", "path": "/metadata/annotations/y", "value": "2"}]

    verdict = admit(pod({"nvidia.com/gpu": "1"}), FACTS, mutate=True, mutators=[first, second])
    assert len(verdict.patch) == 2
    assert MUTATORS  # the default list is non-empty and used without `mutators`


@settings(max_examples=200, deadline=None)
@given(core=st.integers(1, 99), memory=st.integers(0, 320),
       has_annotations=st.booleans(), memory_name=st.sampled_from(
           ["elasticgpu.io/gpu-memory", "tencent.com/vcuda-memory"]),
       core_name=st.sampled_from([None, "tencent.com/vcuda-core", "elasticgpu.io/gpu-core"]))
def test_patches_are_idempotent(core: int, memory: int, has_annotations: bool, memory_name: str,
                                core_name: str | None) -> None:
    limits: dict[str, Any] = {memory_name: str(memory)}
    if core_name:
        limits[core_name] = str(core)
    p = pod(limits, annotations={"k": "v"} if has_annotations else None)
    first = admit(p, FACTS, mutate=True)
    if not first.allowed:
        return
    patched = apply_patch(p, first.patch)
    assert admit(patched, FACTS, mutate=True).patch == ()
    assert admit(patched, FACTS).allowed


# --- cluster facts from Nodes -------------------------------------------------------------

def test_node_gpus_from_capacity() -> None:
    node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "A100"}},
            "status": {"capacity": {"cpu": "64", "nvidia.com/gpu": "8",
                                    "elasticgpu.io/gpu-core": "800",
                                    "elasticgpu.io/gpu-memory": str(8 * 81920),
                                    "tencent.com/vcuda-memory": str(8 * 320)}}}
    assert node_gpus(node) == NodeGpus("n1", 8, 81920, "A100")
    assert node_gpus({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "4"}}}) is None
    assert node_gpus({"metadata": {}, "status": {"capacity": {"nvidia.com/gpu": "x"}}}) is None
    facts = facts_from_nodes([NodeGpus("a", 4, 40960, "T4"), NodeGpus("b", 8, 16384, "")])
    assert (facts.largest_cards, facts.largest_cards_node) == (8, "b")
    assert (facts.largest_card_memory_mib, facts.largest_memory_node) == (40960, "a")
    assert facts.models == {"T4"}


def test_describe_without_container() -> None:
    from elastic_gpu.core.admission.rules import Refusal

    text = describe(Refusal(AdmissionRule.MALFORMED, "spec", "", "must be an object"))
    assert text == "spec: must be an object (rule malformed)"


@pytest.mark.parametrize("pod_level", ["8", {"requests": "8"}])
def test_pod_level_resources_of_the_wrong_shape_are_malformed(pod_level: Any) -> None:
    bad = pod({"nvidia.com/gpu": "1"})
    bad["spec"]["resources"] = pod_level
    verdict = admit(bad, FACTS)
    assert rules(verdict) == [AdmissionRule.MALFORMED]
    assert verdict.message.startswith("spec.resources: must be an object of requests and limits")


def test_a_mig_profile_no_node_offers_is_refused_once_nodes_offer_some() -> None:
    facts = facts_from_nodes([NodeGpus("m", 0, 0, "", frozenset({"nvidia.com/mig-3g.40gb"}))])
    verdict = admit(pod({"nvidia.com/mig-1g.10gb": "1"}), facts)
    assert rules(verdict) == [AdmissionRule.UNKNOWN_MIG_PROFILE]
    assert "nvidia.com/mig-1g.10gb" in verdict.message
    assert "the cluster's: nvidia.com/mig-3g.40gb" in verdict.message
    assert admit(pod({"nvidia.com/mig-3g.40gb": "2"}), facts).allowed
    assert admit(pod({"nvidia.com/mig-1g.10gb": "1"}), FACTS).allowed  # no MIG known: form only


def test_a_node_with_only_mig_instances_is_known() -> None:
    node = {"metadata": {"name": "m"}, "status": {"capacity": {
        "nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "0"}}}
    assert node_gpus(node) == NodeGpus("m", 0, 0, "", frozenset({"nvidia.com/mig-3g.40gb"}))
