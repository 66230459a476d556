"""Issue #26 items 4 and 5, the pure half: the MIG adapter carries out only rules it wrote,
verified against what it recorded before its delete (`core.mig.rules.check_rule`), deletes a live
pod only if it is the one it saved (`check_live_pod`), and a malformed rule is refused alone
with its reason (never an exception that stops the round)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from elastic_gpu.api import migsubstitution as api
from elastic_gpu.core.annotations import MANAGED_BY
from elastic_gpu.core.mig.rules import (
    ADAPTER,
    RuleProblem,
    check_live_pod,
    check_rule,
    recreated_pod,
    saved_pod,
    saved_pod_digest,
)

UID = "0a1b2c3d-0000-4000-8000-0123456789ab"


def live_pod(image: str = "cuda:12", profile: str = "1g.10gb") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train", "namespace": "team", "uid": UID,
                         "resourceVersion": "7", "labels": {"app": "train"}},
            "spec": {"containers": [{"name": "main", "image": image, "resources": {
                "limits": {f"nvidia.com/mig-{profile}": "1"}}}],
                     "restartPolicy": "Always"},
            "status": {"phase": "Pending"}}


def rule_object(saved: Any = None, *, labelled: bool = True, digest: str | None = "auto",
                uid: str | None = UID, pod_name: str = "train") -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"podName": pod_name}, "fromProfile": "1g.10gb",
                            "toProfile": "2g.20gb"}
    if saved is not None:
        spec["savedPod"] = saved
        if digest == "auto" and isinstance(saved, dict):
            spec["savedPodDigest"] = saved_pod_digest(saved)
    if digest not in (None, "auto"):
        spec["savedPodDigest"] = digest
    if uid is not None:
        spec["movedPodUID"] = uid
    meta: dict[str, Any] = {"name": "r", "namespace": "team"}
    if labelled:
        meta["labels"] = {MANAGED_BY: ADAPTER}
    return {"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND, "metadata": meta,
            "spec": spec}


def test_the_adapters_own_rule_passes_and_recreates_exactly_the_saved_pod() -> None:
    rule = api.rule_from_object(rule_object(saved_pod(live_pod())))
    assert rule.written_by_adapter and rule.moved_pod_uid == UID
    assert check_rule(rule) is None
    again = recreated_pod(rule)
    assert again["spec"] == saved_pod(live_pod())["spec"]
    assert check_live_pod(rule, live_pod()) is None


def test_a_rule_without_the_adapters_label_is_ignored_whatever_it_says() -> None:
    evil = saved_pod(live_pod("busybox"))
    evil["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    evil["spec"]["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    refusal = check_rule(api.rule_from_object(rule_object(evil, labelled=False)))
    assert refusal is not None and refusal.problem is RuleProblem.NOT_WRITTEN_BY_ADAPTER
    assert f"{MANAGED_BY}={ADAPTER}" in refusal.message and "ignored" in refusal.message


def test_an_owner_rule_needs_only_the_label() -> None:
    obj = rule_object()
    obj["spec"]["selector"] = {"ownerUID": UID}
    del obj["spec"]["movedPodUID"]
    assert check_rule(api.rule_from_object(obj)) is None
    obj["metadata"]["labels"] = {MANAGED_BY: "someone-else"}
    refusal = check_rule(api.rule_from_object(obj))
    assert refusal is not None and refusal.problem is RuleProblem.NOT_WRITTEN_BY_ADAPTER


def _other_name() -> dict[str, Any]:
    saved = saved_pod(live_pod())
    saved["metadata"]["name"] = "other"
    return saved


def _no_mig() -> dict[str, Any]:
    saved = saved_pod(live_pod())
    saved["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    return saved


@pytest.mark.parametrize(("obj", "problem", "words"), [
    (rule_object(None), RuleProblem.INVALID_SPEC, "spec.savedPod is missing"),
    (rule_object({"spec": "x"}), RuleProblem.INVALID_SPEC, "spec.savedPod.metadata=None"),
    (rule_object({"metadata": {"name": "train"}, "spec": "x"}), RuleProblem.INVALID_SPEC,
     "spec.savedPod.spec='x' is not an object"),
    (rule_object({"metadata": {"name": "train"}, "spec": {"containers": "x"}}),
     RuleProblem.INVALID_SPEC, "spec.savedPod.spec.containers='x' is not a list"),
    (rule_object({"metadata": {"name": "train"}, "spec": {"containers": []}}),
     RuleProblem.INVALID_SPEC, "spec.savedPod.spec.containers=[] is not a list"),
    (rule_object(_other_name()), RuleProblem.INVALID_SPEC,
     "spec.savedPod.metadata.name='other' is not the rule's podName 'train'"),
    (rule_object(_no_mig()), RuleProblem.INVALID_SPEC, "asks no nvidia.com/mig-1g.10gb"),
    (rule_object(saved_pod(live_pod()), uid=None), RuleProblem.UNVERIFIED,
     "spec.movedPodUID is missing"),
    (rule_object(saved_pod(live_pod()), digest=None), RuleProblem.UNVERIFIED,
     "spec.savedPodDigest=None is not the digest"),
    (rule_object(saved_pod(live_pod()), digest=saved_pod_digest(saved_pod(live_pod("x")))),
     RuleProblem.UNVERIFIED, "not the manifest the adapter saved"),
])
def test_a_bad_rule_is_refused_alone_with_its_reason(obj: dict[str, Any], problem: RuleProblem,
                                                     words: str) -> None:
    refusal = check_rule(api.rule_from_object(obj))
    assert refusal is not None and refusal.problem is problem, refusal
    assert words in refusal.message and "MIGSubstitution team/r" in refusal.message


def test_an_edited_saved_pod_no_longer_matches_its_digest() -> None:
    obj = rule_object(saved_pod(live_pod()))
    edited = copy.deepcopy(obj)
    edited["spec"]["savedPod"]["spec"]["containers"][0]["image"] = "evil"
    refusal = check_rule(api.rule_from_object(edited))
    assert refusal is not None and refusal.problem is RuleProblem.UNVERIFIED


def test_saved_pod_of_a_malformed_manifest_does_not_raise() -> None:
    assert saved_pod({"metadata": "x", "spec": "x"})["spec"] == {}


def test_the_live_pod_must_be_the_one_saved() -> None:
    rule = api.rule_from_object(rule_object(saved_pod(live_pod())))
    # the pod the adapter created from the rule (another uid, the same spec) may be replaced
    again = live_pod()
    again["metadata"]["uid"] = "ffffffff-0000-4000-8000-0123456789ab"
    assert check_live_pod(rule, again) is None
    # the pod's uid, another image: a rule naming someone's pod with a manifest of its own
    forged = api.rule_from_object(rule_object(saved_pod(live_pod("evil:latest"))))
    refusal = check_live_pod(forged, live_pod())
    assert refusal is not None and refusal.problem is RuleProblem.POD_MISMATCH
    assert "spec.containers" in refusal.message and "left alone" in refusal.message
    # the pod as the webhook rewrote it (to_profile) is the saved one but for the MIG name
    assert check_live_pod(rule, live_pod(profile="2g.20gb")) is None


def test_a_saved_pod_whose_sidecar_asks_the_profile_is_the_rules_pod() -> None:
    """A sidecar (`restartPolicy: Always`) may hold a MIG instance like a container: a bare pod
    whose sidecar asks `fromProfile` is one the adapter moves, so its rule is carried out."""
    pod = live_pod()
    sidecar = pod["spec"]["containers"].pop()
    pod["spec"]["containers"] = [{"name": "app", "image": "cuda:12"}]
    pod["spec"]["initContainers"] = [{**sidecar, "restartPolicy": "Always"}]
    assert check_rule(api.rule_from_object(rule_object(saved_pod(pod)))) is None
    del pod["spec"]["initContainers"][0]["restartPolicy"]  # a classic init container
    refusal = check_rule(api.rule_from_object(rule_object(saved_pod(pod))))
    assert refusal is not None and "asks no nvidia.com/mig-1g.10gb" in refusal.message
