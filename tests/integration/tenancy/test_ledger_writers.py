"""Issue #26, items 1, 12 and 4 (the policy half): only the system writes the ledger, on a
default sandbox (`egpu sandbox up`), attacked by a tenant bound to `edit` (`kubectl --as`).

Each test replays an attack of the issue: the tenant is refused at the API with a message naming
the key and its writer, and where an admin (trusted) does the same, the extender and the agent
still count only what the scheduler's Binding wrote (docs/architecture.md, "Who writes the
ledger")."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from egpu_testing.sandbox import kubectl, kubectl_run
from egpu_testing.tenant import Tenant
from egpu_testing.waiting import wait_for
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.mig.rules import saved_pod_digest

pytestmark = pytest.mark.integration

HOSTNAME = "kubernetes.io/hostname"
#: the sandbox's default fake nodes: gpu-node-001..004, 8 cards each
NODES = ("gpu-node-001", "gpu-node-002", "gpu-node-003", "gpu-node-004")
CARDS = 8
#: how long a pod on an idle fake node may take to be scheduled and Running on a loaded box
SCHEDULED_S = 180.0


def pod(name: str, limits: dict[str, str] | None = None, *, node_selector: dict[str, str]
        | None = None, node_name: str = "", annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None) -> str:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                            "resources": {"limits": limits or {}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node_name:
        spec["nodeName"] = node_name
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def every_card(node: str) -> str:
    """The assignment a squatter writes by hand: all the node's cards, whole."""
    shares = tuple(CardShare(i, f"GPU-fake-{node}-{i}", 1000, 0) for i in range(CARDS))
    return Assignment(node, {"main": shares}).to_json()


def get_pod(tenant: Tenant, name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(tenant.ok("get", "pod", name, "-o", "json"))
    return result


def running(tenant: Tenant, name: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        got = get_pod(tenant, name)
        return got if got.get("status", {}).get("phase") == "Running" else None
    return check


def wait_running(tenant: Tenant, name: str) -> dict[str, Any]:
    try:
        result: dict[str, Any] = wait_for(f"pod {tenant.namespace}/{name} Running",
                                          running(tenant, name), SCHEDULED_S)
    except AssertionError as err:
        # the diagnosis: what kube-scheduler (and the extender through it) said
        events = tenant.run("get", "events", "--field-selector", f"involvedObject.name={name}",
                            "-o", "custom-columns=REASON:.reason,MESSAGE:.message").stdout
        raise AssertionError(f"{err}; its events:\n{events}") from None
    return result


def cards_of(got: dict[str, Any]) -> set[int]:
    assignment = Assignment.from_json(got["metadata"]["annotations"][ann.ASSIGNMENT])
    return {share.index for share in assignment.shares()}


def test_the_tenant_cannot_bind_a_pod_itself(tenant: Callable[[], Tenant]) -> None:
    """The Binding is the one way the scheduler writes the ledger: edit has no pods/binding."""
    mine = tenant()
    assert mine.can_i("create", "pods")
    answer = mine.run("auth", "can-i", "create", "pods", "--subresource=binding").stdout.strip()
    assert answer == "no"


def test_a_hand_written_assignment_is_refused_and_an_admins_holds_no_card(
        sandbox: Any, tenant: Callable[[], Tenant]) -> None:
    """Issue #26 1a: a pod with no GPU request that never schedules, with an assignment listing
    all 8 cards of a node, held them: "0 of 8 cards are entirely free" for everyone else."""
    mine = tenant()
    node = NODES[0]
    squatter = pod("squatter", node_selector={"nowhere": "true"}, annotations={
        ann.ASSIGNMENT: every_card(node), ann.ASSIGNED_NODE: node})
    refusal = mine.refused("create", "-f", "-", input=squatter)
    assert (f"{ann.ASSIGNMENT} is written only by the Elastic GPU scheduler, through the pod's "
            "Binding: remove it from your pod") in refusal, refusal
    assert "elastic-gpu-pod-ledger" in refusal, refusal
    # the same pod from a cluster admin (trusted, so admitted): the extender still does not
    # count an assignment on a pod that no Binding of its own bound
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "create", "-f", "-", input=squatter)
    mine.ok("create", "-f", "-", input=pod("one-card", {"nvidia.com/gpu": "1"},
                                           node_selector={HOSTNAME: node}))
    got = wait_running(mine, "one-card")
    assert got["spec"]["nodeName"] == node and len(cards_of(got)) == 1
    assert get_pod(mine, "squatter")["spec"].get("nodeName") is None


def test_a_running_pods_assignment_cannot_be_removed_or_changed(
        tenant: Callable[[], Tenant]) -> None:
    """Issue #26 1b: `kubectl annotate pod mine elasticgpu.io/assignment-` on a running 50% pod
    made the extender forget it, and a 60% pod was bound to the same card (110%)."""
    mine = tenant()
    node = NODES[1]
    mine.ok("create", "-f", "-", input=pod("half", {"elasticgpu.io/gpu-core": "50"},
                                           node_selector={HOSTNAME: node}))
    half = wait_running(mine, "half")
    held = cards_of(half)
    refusal = mine.refused("annotate", "pod", "half", f"{ann.ASSIGNMENT}-")
    assert (f"{ann.ASSIGNMENT} is written only by the Elastic GPU scheduler, through the pod's "
            "Binding: it may not be added, changed or removed") in refusal, refusal
    refusal = mine.refused("annotate", "--overwrite", "pod", "half",
                           f"{ann.ASSIGNED_NODE}={NODES[2]}")
    assert f"{ann.ASSIGNED_NODE} is written only by" in refusal, refusal
    # the tenant's own annotations are the tenant's, on the same pod
    mine.ok("annotate", "pod", "half", "team=blue")
    assert get_pod(mine, "half")["metadata"]["annotations"][ann.ASSIGNMENT] == \
        half["metadata"]["annotations"][ann.ASSIGNMENT]
    mine.ok("create", "-f", "-", input=pod("more", {"elasticgpu.io/gpu-core": "60"},
                                           node_selector={HOSTNAME: node}))
    more = wait_running(mine, "more")
    assert more["spec"]["nodeName"] == node
    assert not cards_of(more) & held, f"60% landed on the 50% pod's card {held}"


def test_a_gpu_pod_created_bound_to_a_node_is_refused(tenant: Callable[[], Tenant]) -> None:
    """Issue #26 1c: a GPU pod created with spec.nodeName skipped the extender and, with a copy
    of another pod's assignment, ran on that pod's card."""
    mine = tenant()
    node = NODES[2]
    refusal = mine.refused("create", "-f", "-", input=pod(
        "pinned", {"nvidia.com/gpu": "1"}, node_name=node))
    assert f"spec.nodeName='{node}'" in refusal, refusal
    assert f"use spec.nodeSelector: {{kubernetes.io/hostname: '{node}'}} instead" in refusal
    assert "(rule node-name)" in refusal, refusal
    # with a copy of a running pod's assignment too: refused (the assignment alone would be)
    mine.ok("create", "-f", "-", input=pod("victim", {"nvidia.com/gpu": "1"},
                                           node_selector={HOSTNAME: node}))
    victim = wait_running(mine, "victim")
    copied = {key: victim["metadata"]["annotations"][key]
              for key in (ann.ASSIGNMENT, ann.ASSIGNED_NODE)}
    mine.refused("create", "-f", "-", input=pod("thief", {"nvidia.com/gpu": "1"},
                                                node_name=node, annotations=copied))
    # a pod without a GPU may still be placed by hand: none of the ledger's business
    mine.ok("create", "-f", "-", input=pod("plain", node_name=node))


def test_the_admission_opt_out_label_is_an_admins(sandbox: Any,
                                                  tenant: Callable[[], Tenant]) -> None:
    """Issue #26 12: `elasticgpu.io/admission: ignore` let any tenant's pod skip its
    namespace's budget."""
    mine = tenant()
    opted_out = pod("opted-out", {"nvidia.com/gpu": "1"}, node_selector={"nowhere": "true"},
                    labels={"elasticgpu.io/admission": "ignore"})
    refusal = mine.refused("create", "-f", "-", input=opted_out)
    assert ("the label elasticgpu.io/admission makes the Elastic GPU webhook skip the object"
            in refusal), refusal
    assert "'use' on 'admission-opt-out.elasticgpu.io'" in refusal, refusal
    # nor added later, to a pod or to the namespace
    mine.ok("create", "-f", "-", input=pod("plain", node_selector={"nowhere": "true"}))
    mine.refused("label", "pod", "plain", "elasticgpu.io/admission=ignore")
    # nor on its namespace, even where RBAC lets it label the namespace
    assert not mine.can_i("patch", "namespaces")
    kubectl(sandbox.kubeconfig, "create", "clusterrole", f"{mine.namespace}-labeller",
            "--verb=get,patch", "--resource=namespaces", f"--resource-name={mine.namespace}")
    kubectl(sandbox.kubeconfig, "create", "clusterrolebinding", f"{mine.namespace}-labeller",
            f"--clusterrole={mine.namespace}-labeller", f"--user={mine.user}")
    mine.ok("label", "namespace", mine.namespace, "team=blue")
    refusal = mine.refused("label", "namespace", mine.namespace, "elasticgpu.io/admission=ignore")
    assert "elastic-gpu-admission-opt-out" in refusal, refusal
    # a cluster admin may, and so may whom an admin grants it in this namespace
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "create", "-f", "-", input=opted_out)
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "create", "-f", "-", input=json.dumps({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "opt-out"},
        "rules": [{"apiGroups": [ann.PREFIX], "resources": [ann.OPT_OUT_PERMISSION_RESOURCE],
                   "verbs": [ann.OPT_OUT_PERMISSION_VERB]}]}))
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "create", "rolebinding", "opt-out",
            "--role=opt-out", f"--user={mine.user}")
    mine.ok("label", "pod", "plain", "elasticgpu.io/admission=ignore")


FORGED_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someones-pod"},
              "spec": {"containers": [{"name": "x", "image": "evil",
                                       "securityContext": {"privileged": True}}]}}
#: A forged rule the CRD's schema admits (savedPod with its digest and a moved pod's uid, as
#: the adapter writes them), so that what refuses it is the policy on who writes rules.
MIG_RULE = {
    "apiVersion": "elasticgpu.io/v1alpha", "kind": "MIGSubstitution",
    "metadata": {"name": "forged"},
    "spec": {"fromProfile": "1g.10gb", "toProfile": "7g.80gb", "reason": "mine",
             "selector": {"podName": "someones-pod"}, "savedPod": FORGED_POD,
             "savedPodDigest": saved_pod_digest(FORGED_POD),
             "movedPodUID": "00000000-0000-0000-0000-000000000000"},
}


def test_only_the_system_writes_mig_substitution_rules(sandbox: Any,
                                                       tenant: Callable[[], Tenant]) -> None:
    """Issue #26 4: a rule whose savedPod is privileged was turned into that pod by the
    controller. RBAC keeps `edit` from rules; the policy keeps anyone who is not the system
    from them, however RBAC is granted (here: a Role allowing every verb on them)."""
    mine = tenant()
    assert not mine.can_i("create", "migsubstitutions.elasticgpu.io")
    mine.refused("create", "-f", "-", input=json.dumps(MIG_RULE))
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "create", "role", "rules",
            "--verb=*", "--resource=migsubstitutions.elasticgpu.io")
    kubectl(sandbox.kubeconfig, "-n", mine.namespace, "create", "rolebinding", "rules",
            "--role=rules", f"--user={mine.user}")
    assert mine.can_i("create", "migsubstitutions.elasticgpu.io")
    refusal = mine.refused("create", "-f", "-", input=json.dumps(MIG_RULE))
    assert "MIGSubstitution rules are written only by the Elastic GPU controller" in refusal, \
        refusal
    # the system (here the admin, whose credentials the sandbox's components use) may; only
    # tried (dry run): the controller would act on a rule that exists
    created = kubectl_run(sandbox.kubeconfig, "-n", mine.namespace, "create", "--dry-run=server",
                          "-f", "-", input=json.dumps(MIG_RULE))
    assert created.returncode == 0, created.stderr
