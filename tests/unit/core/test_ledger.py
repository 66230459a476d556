"""Who writes the ledger (issue #26, item 1): the pure rules. An assignment counts only where
the scheduler's Binding wrote it; a GPU pod may not be created bound; the MIG annotations a pod
brings are the webhook's to keep or drop; the admission policies cover every system key.
The policies themselves are exercised on a real apiserver in tests/integration/tenancy."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from elastic_gpu.api import admission_policies
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.admission.rules import AdmissionRule, describe
from elastic_gpu.core.assignment import Assignment, CardShare, distrust, trusted_assignment
from elastic_gpu.core.mig.rules import SubstitutionRule
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.scheduler.state import PodInfo

CARD = CardShare(0, "GPU-0", 500, 0)
ON_N1 = Assignment("n1", {"main": (CARD,)})


@pytest.mark.parametrize(("node_name", "assigned", "assignment", "trusted"), [
    ("n1", "n1", ON_N1, True),
    ("", "n1", ON_N1, False),  # never bound (nodeSelector nowhere): holds nothing
    ("", None, ON_N1, False),
    ("n1", None, ON_N1, False),  # the Binding always writes assigned-node
    ("n2", "n1", ON_N1, False),  # bound elsewhere
    ("n2", "n2", ON_N1, False),  # the annotation moved, the assignment did not
])
def test_an_assignment_is_trusted_only_as_the_binding_writes_it(
        node_name: str, assigned: str | None, assignment: Assignment, trusted: bool) -> None:
    reason = distrust(node_name, assigned, assignment)
    assert (reason is None) == trusted
    if reason is not None:
        assert reason  # a sentence for the log


def _pod(node_name: str = "", annotations: dict[str, str] | None = None,
         resources: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x",
                                            "resources": resources or {}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "5",
                         "annotations": annotations or {}},
            "spec": spec, "status": {"phase": "Pending"}}


def test_the_extender_counts_no_assignment_its_binding_did_not_write() -> None:
    forged = {ann.ASSIGNMENT: ON_N1.to_json(), ann.ASSIGNED_NODE: "n1"}
    unbound = PodInfo.from_manifest(_pod("", forged))
    assert unbound.holds is None and unbound.distrusted
    elsewhere = PodInfo.from_manifest(_pod("n2", forged))
    assert elsewhere.holds is None and elsewhere.distrusted
    bound = PodInfo.from_manifest(_pod("n1", forged))
    assert bound.holds == ON_N1 and bound.distrusted is None
    assert PodInfo.from_manifest(_pod("n1")).distrusted is None  # no assignment: nothing to say


def test_a_pods_trusted_assignment_is_read_once_for_the_agent_and_the_controllers() -> None:
    """`trusted_assignment`: what the agent's accounting and the mig-dynamic controller's
    ledger both read from a pod (the Binding's assignment, else nothing)."""
    forged = {ann.ASSIGNMENT: ON_N1.to_json(), ann.ASSIGNED_NODE: "n1"}
    assert trusted_assignment(_pod("n1", forged)) == ON_N1
    assert trusted_assignment(_pod("", forged)) is None
    assert trusted_assignment(_pod("n2", forged)) is None
    assert trusted_assignment(_pod("n1")) is None
    assert trusted_assignment(_pod("n1", {ann.ASSIGNMENT: "{", ann.ASSIGNED_NODE: "n1"})) is None


def test_the_extender_state_ignores_and_reports_a_distrusted_assignment() -> None:
    from elastic_gpu.scheduler.state import SchedulerState

    state = SchedulerState()
    forged = {ann.ASSIGNMENT: ON_N1.to_json(), ann.ASSIGNED_NODE: "n1"}
    state.observe_pod(_pod("", forged))
    assert state.holds() == {} and list(state.distrusted()) == ["u1"]
    state.forget_pod("u1")
    assert state.distrusted() == {}


GPU = {"limits": {"elasticgpu.io/gpu-core": "50"}, "requests": {"elasticgpu.io/gpu-core": "50"}}


def test_a_gpu_pod_created_bound_to_a_node_is_refused_with_the_nodeselector_to_use() -> None:
    verdict = admit(_pod("gpu-node-1", resources=GPU), ClusterFacts(), mutate=True)
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.NODE_NAME]
    message = describe(verdict.refusals[0])
    assert "spec.nodeName='gpu-node-1'" in message
    assert "nodeSelector: {kubernetes.io/hostname: 'gpu-node-1'}" in message
    assert "(rule node-name)" in message
    # unbound, the same pod is fine; bound, a pod without a GPU is none of admission's business
    assert admit(_pod("", resources=GPU), ClusterFacts()).allowed
    assert admit(_pod("gpu-node-1"), ClusterFacts()).allowed


def test_a_claim_backed_pod_created_bound_is_refused_too() -> None:
    from elastic_gpu.core.admission.claim_plan import PodClaims
    from elastic_gpu.core.claims.model import Claim

    pod = _pod("gpu-node-1", {ann.CLAIM_PREFIX + "main": "c1"})
    claim = Claim("ns", "c1", "uid-c1", None, {"elasticgpu.io/gpu-core": 50})
    verdict = admit(pod, ClusterFacts(), claims=PodClaims("ns", {"c1": claim}))
    assert [r.rule for r in verdict.refusals] == [AdmissionRule.NODE_NAME]


P = MigProfile.parse
MIG = {"limits": {"nvidia.com/mig-1g.10gb": "1"}, "requests": {"nvidia.com/mig-1g.10gb": "1"}}


def _mutated(pod: dict[str, Any], *rules: SubstitutionRule) -> dict[str, Any]:
    verdict = admit(pod, replace(ClusterFacts(), mig_substitutions=rules), mutate=True)
    assert verdict.allowed, verdict.message
    result: dict[str, Any] = apply_patch(pod, verdict.patch)
    return result


def test_mig_annotations_a_pod_brings_are_dropped_unless_the_webhook_wrote_them() -> None:
    forged = {ann.MIG_ORIGINAL: "main=7g.80gb", ann.MIG_SUBSTITUTION: "someone-elses", "k": "v"}
    # no rule selects the pod: both go, the rest stays
    after = _mutated(_pod(annotations=dict(forged), resources=MIG))
    assert after["metadata"]["annotations"] == {"k": "v"}
    # a rule selects it and moves it: the webhook's own record replaces the forged one
    rule = SubstitutionRule("r1", "ns", P("1g.10gb"), P("2g.20gb"), pod_name="p")
    after = _mutated(_pod(annotations=dict(forged), resources=MIG), rule)
    assert after["metadata"]["annotations"] == {
        "k": "v", ann.MIG_ORIGINAL: "main=1g.10gb", ann.MIG_SUBSTITUTION: "r1"}
    # reinvoked on its own output, the webhook keeps it
    assert _mutated(after, rule) == after


def test_every_system_annotation_has_a_validation_in_the_pod_policy() -> None:
    policy = admission_policies.pod_ledger_policy()
    validations = policy["spec"]["validations"]
    assert len(validations) == len(ann.SYSTEM_POD_ANNOTATIONS)
    for note, validation in zip(ann.SYSTEM_POD_ANNOTATIONS, validations, strict=True):
        assert f'"{note.key}"' in validation["expression"]
        assert validation["expression"].startswith("variables.system || ")
        text = validation.get("message") or validation["messageExpression"]
        assert note.key in text and note.writer in text
        # a key the webhook writes at creation is free at CREATE, a ledger key never
        assert ("request.operation == 'CREATE' ||" in validation["expression"]) == \
            note.set_at_create
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
    assert {ann.ASSIGNMENT, ann.ASSIGNED_NODE} <= {n.key for n in ann.SYSTEM_POD_ANNOTATIONS
                                                   if not n.set_at_create}


def test_the_defrag_reservation_is_the_systems_from_creation_on() -> None:
    """Issue 30: a tenant who could write `elasticgpu.io/defrag-reservation` would keep cards
    for a pod that never binds (the extender counts a live one as held)."""
    note, = (n for n in ann.SYSTEM_POD_ANNOTATIONS if n.key == ann.DEFRAG_RESERVATION)
    assert not note.set_at_create and "controller" in note.writer
    validations = admission_policies.pod_ledger_policy()["spec"]["validations"]
    validation, = (v for v in validations if f'"{ann.DEFRAG_RESERVATION}"' in v["expression"])
    # neither at CREATE (absent) nor later (unchanged) unless the requester is the system
    assert validation["expression"] == (
        f'variables.system || (request.operation == \'CREATE\' ? '
        f'!object.metadata.?annotations[?"{ann.DEFRAG_RESERVATION}"].hasValue() : '
        f'(object.metadata.?annotations[?"{ann.DEFRAG_RESERVATION}"] == '
        f'oldObject.metadata.?annotations[?"{ann.DEFRAG_RESERVATION}"]))')


def test_the_defrag_plan_record_is_the_systems_from_creation_on() -> None:
    """Issue 30: `egpu top` shows the plan recorded on a pending pod; a tenant who could write
    `elasticgpu.io/defrag-plan` would make it show a plan the controller never made."""
    note, = (n for n in ann.SYSTEM_POD_ANNOTATIONS if n.key == ann.DEFRAG_PLAN)
    assert not note.set_at_create and "controller" in note.writer
    validations = admission_policies.pod_ledger_policy()["spec"]["validations"]
    validation, = (v for v in validations if f'"{ann.DEFRAG_PLAN}"' in v["expression"])
    assert validation["expression"].startswith("variables.system || (request.operation == "
                                               "'CREATE' ? !object.metadata")


def test_every_policy_has_its_binding() -> None:
    objects = admission_policies.manifests()
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bound = {o["spec"]["policyName"] for o in objects
             if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == bound == {admission_policies.POD_LEDGER, admission_policies.MIG_RULES,
                                 admission_policies.OPT_OUT, admission_policies.DRA_GATE}
