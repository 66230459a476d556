"""Node selector, required node affinity and taints, as kube-scheduler's filters decide."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.core.nodeaffinity import (
    PlacementRules,
    RulesError,
    Taint,
    Toleration,
    affinity_matches,
    refusal,
    rules_from_manifest,
    taints_from_node,
)

LABELS = {"zone": "a", "gpu": "A100", "cores": "64", "odd": "x1"}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}], **spec}}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def matches(manifest: dict[str, Any], node: str = "n1") -> bool:
    return affinity_matches(rules_from_manifest(manifest), node, LABELS)


def test_no_rules_match_every_node() -> None:
    assert matches(pod())
    assert refusal(rules_from_manifest(pod()), "n1", {}, ()) is None


def test_node_selector_needs_every_label_exactly() -> None:
    assert matches(pod(nodeSelector={"zone": "a", "gpu": "A100"}))
    assert not matches(pod(nodeSelector={"zone": "b"}))
    assert not matches(pod(nodeSelector={"missing": ""}))


@pytest.mark.parametrize(("requirement", "expected"), [
    (expr("zone", "In", "a", "b"), True),
    (expr("zone", "In", "b"), False),
    (expr("absent", "In", "a"), False),
    (expr("zone", "NotIn", "b"), True),
    (expr("zone", "NotIn", "a"), False),
    (expr("absent", "NotIn", "a"), True),
    (expr("zone", "Exists"), True),
    (expr("absent", "Exists"), False),
    (expr("zone", "Exists", "a"), False),  # values with Exists: invalid, matches nothing
    (expr("absent", "DoesNotExist"), True),
    (expr("zone", "DoesNotExist"), False),
    (expr("cores", "Gt", "32"), True),
    (expr("cores", "Gt", "64"), False),
    (expr("cores", "Lt", "65"), True),
    (expr("cores", "Lt", "64"), False),
    (expr("odd", "Gt", "0"), False),  # a label that is not an integer
    (expr("cores", "Gt", "x"), False),
    (expr("cores", "Gt", "1", "2"), False),  # Gt takes exactly one value
    (expr("absent", "Lt", "100"), False),
    (expr("zone", "Near", "a"), False),  # unknown operator
])
def test_match_expressions(requirement: dict[str, Any], expected: bool) -> None:
    assert matches(pod(affinity=required({"matchExpressions": [requirement]}))) is expected


def test_terms_are_ored_and_requirements_anded() -> None:
    both = {"matchExpressions": [expr("zone", "In", "a"), expr("gpu", "In", "T4")]}
    assert not matches(pod(affinity=required(both)))
    assert matches(pod(affinity=required(both, {"matchExpressions": [expr("gpu", "Exists")]})))
    assert not matches(pod(affinity=required()))  # no terms: no node
    assert not matches(pod(affinity=required({})))  # an empty term matches nothing
    # selector and affinity must both hold
    assert not matches(pod(nodeSelector={"zone": "b"},
                           affinity=required({"matchExpressions": [expr("zone", "In", "a")]})))


def test_match_fields_by_node_name() -> None:
    by_name = pod(affinity=required({"matchFields": [expr("metadata.name", "In", "n1")]}))
    assert matches(by_name, "n1") and not matches(by_name, "n2")
    not_name = pod(affinity=required({"matchFields": [expr("metadata.name", "NotIn", "n1")]}))
    assert not matches(not_name, "n1") and matches(not_name, "n2")
    other = pod(affinity=required({"matchFields": [expr("metadata.uid", "In", "n1")]}))
    assert not matches(other, "n1")
    exists = pod(affinity=required({"matchFields": [expr("metadata.name", "Exists")]}))
    assert not matches(exists, "n1")


NO_SCHEDULE = Taint("dedicated", "ml", "NoSchedule")


@pytest.mark.parametrize(("toleration", "tolerated"), [
    (Toleration("dedicated", "Equal", "ml", "NoSchedule"), True),
    (Toleration("dedicated", "Equal", "ml", ""), True),  # empty effect: all effects
    (Toleration("dedicated", "Equal", "web", "NoSchedule"), False),
    (Toleration("dedicated", "Exists", "", "NoSchedule"), True),
    (Toleration("dedicated", "Exists", "", "NoExecute"), False),
    (Toleration("", "Exists", "", ""), True),  # tolerates everything
    (Toleration("other", "Exists"), False),
    (Toleration("dedicated", "Sometimes", "ml"), False),
])
def test_tolerations(toleration: Toleration, tolerated: bool) -> None:
    assert toleration.tolerates(NO_SCHEDULE) is tolerated


def test_only_filtering_effects_refuse() -> None:
    rules = PlacementRules()
    assert refusal(rules, "n", {}, (Taint("soft", "", "PreferNoSchedule"),)) is None
    reason = refusal(rules, "n", {}, (Taint("soft", "", "PreferNoSchedule"), NO_SCHEDULE))
    assert reason == "the node has a taint the pod does not tolerate (dedicated=ml:NoSchedule)"
    evict = refusal(rules, "n", {}, (Taint("node.kubernetes.io/unreachable", "", "NoExecute"),))
    assert evict is not None and "node.kubernetes.io/unreachable:NoExecute" in evict
    tolerant = rules_from_manifest(pod(tolerations=[{"key": "dedicated", "operator": "Equal",
                                                     "value": "ml", "effect": "NoSchedule"}]))
    assert refusal(tolerant, "n", {}, (NO_SCHEDULE,)) is None
    assert refusal(rules_from_manifest(pod(nodeSelector={"zone": "b"})), "n", LABELS, ()) == (
        "the node does not match the pod's node selector or required node affinity")


def test_taints_from_node_dicts() -> None:
    node = {"spec": {"taints": [{"key": "a", "value": "1", "effect": "NoSchedule"},
                                {"key": "b", "effect": "NoExecute"}, "junk", {"key": 3}]}}
    assert taints_from_node(node) == (Taint("a", "1", "NoSchedule"), Taint("b", "", "NoExecute"))
    assert taints_from_node({}) == () and taints_from_node({"spec": "x"}) == ()


@pytest.mark.parametrize("spec", [
    {"nodeSelector": "zone=a"},
    {"nodeSelector": {"zone": 1}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}},
    {"affinity": required({"matchExpressions": [{"key": "k", "operator": "In", "values": "a"}]})},
    {"tolerations": [{"key": 1}]},
    {"tolerations": {"key": "a"}},
])
def test_malformed_rules_are_an_error_naming_the_field(spec: dict[str, Any]) -> None:
    with pytest.raises(RulesError, match="spec"):
        rules_from_manifest(pod(**spec))
