"""The ValidatingAdmissionPolicies that keep the system's records to the system (issue #26,
docs/architecture.md "Who writes the ledger"), as plain dicts: one source for the Helm chart
(`charts/elastic-gpu/files/admission-policies.yaml`, written by hack/gen-chart-files.py and
checked by tests/unit/chart) and for `egpu sandbox up` (`install`).

- `elastic-gpu-pod-ledger`: a pod may not be created with an annotation the system owns
  (`core.annotations.SYSTEM_POD_ANNOTATIONS`; those the webhook writes at creation excepted,
  it is authoritative over them), and no one but the system adds, changes or removes one;
- `elastic-gpu-mig-rules`: MIGSubstitutions (which the MIG adapter turns into pods) are
  created and changed only by the system;
- `elastic-gpu-admission-opt-out`: the webhook's opt-out label `elasticgpu.io/admission` is
  set on a pod or namespace only by who holds `use` on `admission-opt-out.elasticgpu.io`;
- `elastic-gpu-dra-gate`: the gate `elasticgpu.io/dra-placement` is removed only by the
  extender's ServiceAccount (`elastic-gpu-scheduler`, its DRA allocator, once it has placed
  the pod's claims) or the system: a tenant who lifted it would let kube-scheduler allocate her
  claim while our allocator writes another on the same card. And that account, which may patch
  every pod to lift the gate, may change a pod only by removing it, as NodeRestriction narrows
  a kubelet: a stolen token of the extender cannot relabel, re-image or un-gate other
  schedulers' pods.

"The system" is whoever holds a virtual RBAC permission (`write` on `ledger.elasticgpu.io`),
asked through CEL's authorizer: the chart grants it to the ServiceAccount that writes these
records, cluster admins hold it through `*`, `edit` and `admin` never do. No ServiceAccount name
is written into a policy, so the same objects serve the chart, the sandbox (whose components use
the admin's credentials) and any other installation.

The Binding subresource (`pods/binding`, through which the scheduler writes the assignment)
and `pods/status` are not `pods` to a policy: they are not matched, and `edit` has neither.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from elastic_gpu.api.migsubstitution import PLURAL as RULES_PLURAL
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.rules import OPT_OUT_LABEL

API_VERSION = "admissionregistration.k8s.io/v1"
POD_LEDGER = "elastic-gpu-pod-ledger"
MIG_RULES = "elastic-gpu-mig-rules"
OPT_OUT = "elastic-gpu-admission-opt-out"
DRA_GATE = "elastic-gpu-dra-gate"
#: The extender's ServiceAccount name (the chart's; in any namespace).
SCHEDULER_ACCOUNT = "elastic-gpu-scheduler"
LABELS = {"app.kubernetes.io/part-of": "elastic-gpu"}
#: Where the reasoning is, for every message.
SEE = 'docs/architecture.md, "Who writes the ledger"'


def _cel(text: str) -> str:
    """A CEL string literal (JSON's escaping is CEL's for these strings)."""
    return json.dumps(text)


def system_check() -> str:
    """CEL: the requester holds the system's virtual permission (cluster-wide)."""
    return (f"authorizer.group({_cel(ann.SYSTEM_PERMISSION_GROUP)})"
            f".resource({_cel(ann.SYSTEM_PERMISSION_RESOURCE)})"
            f".check({_cel(ann.SYSTEM_PERMISSION_VERB)}).allowed()")


def _annotation(obj: str, key: str) -> str:
    """CEL: the optional value of annotation `key` of `obj` (`optional.none()` when absent)."""
    return f"{obj}.metadata.?annotations[?{_cel(key)}]"


def _label(obj: str, key: str) -> str:
    return f"{obj}.metadata.?labels[?{_cel(key)}]"


def _annotation_validation(note: ann.SystemAnnotation) -> dict[str, Any]:
    unchanged = f"({_annotation('object', note.key)} == {_annotation('oldObject', note.key)})"
    head = f"{note.key} is written only by {note.writer}"
    if note.set_at_create:
        # the webhook writes it during the CREATE of whoever makes the pod, and drops any value
        # it did not write (core.admission.mutators.mig.mig_substitution)
        expression = f"variables.system || request.operation == 'CREATE' || {unchanged}"
        return {"expression": expression, "reason": "Forbidden",
                "message": f"{head}: it may not be added, changed or removed ({SEE})"}
    absent = f"!{_annotation('object', note.key)}.hasValue()"
    expression = (f"variables.system || (request.operation == 'CREATE' ? {absent} : "
                  f"{unchanged})")
    message = (f"request.operation == 'CREATE' ? "
               f"{_cel(f'{head}: remove it from your pod ({SEE})')} : "
               f"{_cel(f'{head}: it may not be added, changed or removed ({SEE})')}")
    return {"expression": expression, "messageExpression": message, "reason": "Forbidden"}


def _policy(name: str, rules: list[dict[str, Any]], variables: list[dict[str, str]],
            validations: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": dict(LABELS)},
            "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
                     "variables": variables, "validations": list(validations)}}


def pod_ledger_policy() -> dict[str, Any]:
    """Pods: the system's annotations are the system's."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["pods"]}]
    return _policy(POD_LEDGER, rules, [{"name": "system", "expression": system_check()}],
                   (_annotation_validation(n) for n in ann.SYSTEM_POD_ANNOTATIONS))


def mig_rules_policy() -> dict[str, Any]:
    """MIGSubstitutions: written by the system only."""
    rules = [{"apiGroups": [ann.PREFIX], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
              "resources": [RULES_PLURAL, f"{RULES_PLURAL}/status"]}]
    message = ("MIGSubstitution rules are written only by the Elastic GPU controller (the MIG "
               "adapter re-creates pods from them, docs/mig-adapter.md); no one else may create "
               f"or change one ({SEE})")
    return _policy(MIG_RULES, rules, [{"name": "system", "expression": system_check()}],
                   [{"expression": "variables.system", "message": message,
                     "reason": "Forbidden"}])


def opt_out_policy() -> dict[str, Any]:
    """The webhook's opt-out label, on pods (namespaced grants count) and namespaces."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["pods", "namespaces"]}]
    check = (f".resource({_cel(ann.OPT_OUT_PERMISSION_RESOURCE)})"
             f"{{}}.check({_cel(ann.OPT_OUT_PERMISSION_VERB)}).allowed()")
    group = f"authorizer.group({_cel(ann.SYSTEM_PERMISSION_GROUP)})"
    allowed = (f"request.resource.resource == 'namespaces' ? {group}{check.format('')} : "
               f"{group}{check.format('.namespace(request.namespace)')}")
    label = _label("object", OPT_OUT_LABEL)
    expression = (f"variables.allowed || !{label}.hasValue() || (request.operation == 'UPDATE' "
                  f"&& {label} == {_label('oldObject', OPT_OUT_LABEL)})")
    message = (f"the label {OPT_OUT_LABEL} makes the Elastic GPU webhook skip the object (its "
               "budget, quota and checks); only holders of the permission "
               f"'{ann.OPT_OUT_PERMISSION_VERB}' on "
               f"'{ann.OPT_OUT_PERMISSION_RESOURCE}.{ann.SYSTEM_PERMISSION_GROUP}', which a "
               "cluster admin grants, may set it: remove it (docs/webhook.md, \"Opting out\")")
    return _policy(OPT_OUT, rules, [{"name": "allowed", "expression": allowed}],
                   [{"expression": expression, "message": message, "reason": "Forbidden"}])


def scheduler_account_check() -> str:
    """CEL: the requester is the extender's ServiceAccount (the chart's name, any namespace)."""
    return ("request.userInfo.username.startsWith('system:serviceaccount:') && "
            f"request.userInfo.username.endsWith(':{SCHEDULER_ACCOUNT}')")


def dra_gate_policy() -> dict[str, Any]:
    """Our DRA placement gate: removed only by the extender's ServiceAccount (whose pod UPDATE
    may do nothing else) or the system; a tenant's removal is refused."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
              "resources": ["pods"]}]
    gate = _cel(ann.DRA_PLACEMENT_GATE)

    def same(path: str, empty: str) -> str:
        return f"object.{path}.orValue({empty}) == oldObject.{path}.orValue({empty})"

    old_gates = "oldObject.spec.?schedulingGates.orValue([])"
    new_gates = "object.spec.?schedulingGates.orValue([])"
    was_gated = f"{old_gates}.exists(g, g.name == {gate})"
    lifted = (f"{was_gated} && {new_gates}.map(g, g.name) == "
              f"{old_gates}.map(g, g.name).filter(n, n != {gate})")
    unchanged = " && ".join([
        same("metadata.?labels", "{}"), same("metadata.?annotations", "{}"),
        same("metadata.?finalizers", "[]"), same("metadata.?ownerReferences", "[]"),
        "object.spec.containers.map(c, c.image) == oldObject.spec.containers.map(c, c.image)",
        "object.spec.?initContainers.orValue([]).map(c, c.image) == "
        "oldObject.spec.?initContainers.orValue([]).map(c, c.image)",
        same("spec.?tolerations", "[]"), same("spec.?activeDeadlineSeconds", "-1")])
    narrowed = (f"{SCHEDULER_ACCOUNT} may change a pod only by removing the scheduling gate "
                f"{ann.DRA_PLACEMENT_GATE} (docs/dra.md, \"Claims placed by our engine\")")
    # who decides which card a claim holds is the system (DESIGN.md §9): a tenant who lifts
    # the gate lets kube-scheduler allocate her claim while our allocator writes another on
    # the same card, from caches that have not seen each other's writes
    reserved = (f"the scheduling gate {ann.DRA_PLACEMENT_GATE} is removed only by the Elastic "
                "GPU scheduler, once its DRA allocator has placed the pod's claims; the pod "
                "waits gated until then, also while no allocator serves (docs/dra.md, "
                "\"Claims placed by our engine\")")
    variables = [{"name": "scheduler", "expression": scheduler_account_check()},
                 {"name": "system", "expression": system_check()}]
    policy = _policy(DRA_GATE, rules, variables, [
        {"expression": f"!variables.scheduler || ({lifted} && {unchanged})",
         "message": narrowed, "reason": "Forbidden"},
        {"expression": (f"!{was_gated} || {new_gates}.exists(g, g.name == {gate}) || "
                        "variables.scheduler || variables.system"),
         "message": reserved, "reason": "Forbidden"}])
    # only the extender's requests and updates of a pod our gate holds are evaluated
    policy["spec"]["matchConditions"] = [{
        "name": "scheduler-account-or-gated",
        "expression": f"({scheduler_account_check()}) || {was_gated}"}]
    return policy


def binding(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy's binding: everywhere, refusing."""
    name = str(policy["metadata"]["name"])
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": dict(LABELS)},
            "spec": {"policyName": name, "validationActions": ["Deny"]}}


def ledger_manifests() -> list[dict[str, Any]]:
    """The ledger's policies (pods' system annotations, MIG rules, the extender's pod patches)
    and their bindings."""
    policies = [pod_ledger_policy(), mig_rules_policy(), dra_gate_policy()]
    return policies + [binding(p) for p in policies]


def opt_out_manifests() -> list[dict[str, Any]]:
    policy = opt_out_policy()
    return [policy, binding(policy)]


def manifests() -> list[dict[str, Any]]:
    """Every policy and binding, as the sandbox applies them."""
    return ledger_manifests() + opt_out_manifests()


#: Who `probe_refused` asks as: kube-apiserver's bootstrap RBAC lets the ReplicaSet controller
#: create pods anywhere, and it does not hold the system's permission.
PROBE_USER = "system:serviceaccount:kube-system:replicaset-controller"


def probe_pod() -> dict[str, Any]:
    """A pod that `elastic-gpu-pod-ledger` refuses to anyone but the system: it carries an
    assignment (and asks no GPU, so no webhook is called)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "elastic-gpu-policy-probe",
                         "annotations": {ann.ASSIGNMENT: "{}"}},
            "spec": {"automountServiceAccountToken": False,
                     "containers": [{"name": "probe", "image": "probe"}]}}


def probe_refused(stderr: str) -> bool:
    """Whether a (dry-run) create of `probe_pod` as `PROBE_USER` was refused by the policy:
    kube-apiserver enforces a policy only once its informer has it, a moment after creation."""
    return POD_LEDGER in stderr

