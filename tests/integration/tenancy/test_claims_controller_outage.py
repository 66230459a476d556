"""Issue #26, items 2 and 3, on a default sandbox with a tenant bound to `edit`: a claim never
vanishes under its pod, and an outage of `egpu controller` (SIGKILLed: nothing released)
freezes no card.

Item 2 (a claim protected like a PVC):
- with the controller down, a WaitForFirstConsumer claim gets the claim-protection finalizer
  at creation (the webhook's); its pod is bound (the extender provisions at bind); the
  tenant's delete leaves the claim Terminating; the restarted controller binds it to the
  ElasticGPU its pod holds and keeps both while the pod runs, and a whole-card pod pinned to
  the node does not get the pod's card; once the pod is gone, the claim, the ElasticGPU and
  the card go;
- the tenant strips the finalizer (edit may) and an admin deletes the ElasticGPU: the
  controller releases nothing while the pod runs, and the extender keeps the card counted
  under the pod until it is gone;
- an Immediate claim left Unschedulable has the finalizer, and deleting a namespace's claims
  while Pending pods name them leaves them Terminating until the pods are gone.

Item 3 (no card waits for the controller):
- no GPUBudget in the namespace: its GPU pods get no budget finalizer, so deleting one with
  the controller down frees its card for a waiting pod;
- with a GPUBudget: the pod keeps the finalizer (the ledger stays lossless: the keeper's fault
  test), yet its card is free as soon as its containers have stopped.

kwok plays kubelet here: it deletes a deleted pod at once (grace 0) and never stops
containers, so where a kubelet would report a container terminated the test patches the
status, as tests/integration/budget/test_budget_ledger_faults.py does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing import components
from egpu_testing.sandbox import kubectl, kubectl_run
from egpu_testing.tenant import Tenant
from egpu_testing.waiting import wait_for
from elastic_gpu.core.budget.settle import FINALIZER as BUDGET_FINALIZER
from elastic_gpu.core.claims.pods import CLAIM_PROTECTION_FINALIZER

#: the `sandbox` fixture of this directory's conftest (kubeconfig, state_dir)
Sandbox = Any

pytestmark = pytest.mark.integration

CONTROLLER = "egpu-controller"
WHOLE = "nvidia.com/gpu"
#: generous: the box may be loaded; a deadline that expires is a failure of behaviour
DEADLINE_S = 120.0

#: What item 15's aggregated ClusterRole gives `edit` on claims; granted here in the tenant's
#: namespace so these tests do not depend on it.
CLAIMS_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: claims, namespace: {ns}}}
rules:
- apiGroups: [elasticgpu.io]
  resources: [elasticgpuclaims]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: claims, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: claims}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}
"""


def get(kc: Path, *args: str) -> dict[str, Any] | None:
    """`kubectl get ... -o json` as the admin; None when it does not exist."""
    result = kubectl_run(kc, "get", *args, "-o", "json")
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def diagnosis(kc: Path, ns: str) -> str:
    return "\n".join([
        kubectl_run(kc, "get", "egpuc,pods", "-n", ns, "-o", "wide").stdout,
        kubectl_run(kc, "get", "egpu", "-o", "wide").stdout,
        kubectl_run(kc, "get", "events", "-n", ns, "--sort-by=.lastTimestamp").stdout[-3000:]])


def until(kc: Path, ns: str, what: str, check: Callable[[], Any]) -> Any:
    """`wait_for` with the cluster's state in the message when the deadline expires."""
    try:
        return wait_for(what, check, DEADLINE_S)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnosis(kc, ns)}") from None


def reasons(kc: Path, ns: str, name: str) -> set[str]:
    out = kubectl(kc, "get", "events", "-n", ns, "-o", "json",
                  "--field-selector", f"involvedObject.name={name}")
    return {e["reason"] for e in json.loads(out)["items"]}


def gpu_nodes(kc: Path) -> list[str]:
    nodes = json.loads(kubectl(kc, "get", "nodes", "-o", "json"))["items"]
    return sorted(n["metadata"]["name"] for n in nodes
                  if int((n["status"].get("capacity") or {}).get(WHOLE, "0")) == 8)


def pod(name: str, node: str, cards: int = 0, claim: str | None = None) -> str:
    """A pod pinned to `node` (a nodeSelector on kubernetes.io/hostname) asking `cards`
    whole cards, or using `claim` for its container."""
    meta: dict[str, Any] = {"name": name}
    container: dict[str, Any] = {"name": "main", "image": "busybox", "command": ["sleep", "1d"]}
    if claim is not None:
        meta["annotations"] = {"egpuc.elasticgpu.io/main": claim}
    else:
        container["resources"] = {"limits": {WHOLE: str(cards)}}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container]}})


def claim(name: str, cls: str, cards: int = 1) -> str:
    return json.dumps({"apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPUClaim",
                       "metadata": {"name": name},
                       "spec": {"egpuClassName": cls,
                                "resources": {"requests": {WHOLE: cards}}}})


def assignment(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(obj["metadata"]["annotations"]["elasticgpu.io/assignment"])
    return out


def cards_of(obj: dict[str, Any]) -> set[int]:
    return {c["index"] for shares in assignment(obj)["containers"].values() for c in shares}


class Cluster:
    """The sandbox as the admin and one tenant see it."""

    def __init__(self, sandbox: Sandbox, tenant: Tenant) -> None:
        self.kc = sandbox.kubeconfig
        self.state_dir = sandbox.state_dir
        self.tenant = tenant
        self.ns = tenant.namespace
        kubectl(self.kc, "apply", "-f", "-",
                input=CLAIMS_ROLE.format(ns=self.ns, user=tenant.user))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return get(self.kc, kind, name, "-n", self.ns)

    def until(self, what: str, check: Callable[[], Any]) -> Any:
        return until(self.kc, self.ns, what, check)

    def bound(self, name: str) -> dict[str, Any]:
        """Wait until pod `name` is bound; the pod."""
        found: dict[str, Any] = self.until(
            f"pod {name} bound", lambda: (p := self.get("pod", name)) and
            p["spec"].get("nodeName") and p)
        return found

    def turned_away(self, name: str) -> None:
        """Wait until kube-scheduler has reported pod `name` unschedulable; it is not bound."""
        self.until(f"kube-scheduler to find no room for pod {name}",
                   lambda: "FailedScheduling" in reasons(self.kc, self.ns, name))
        found = self.get("pod", name)
        assert found is not None and not found["spec"].get("nodeName"), \
            f"pod {name} was bound to node {found and found['spec'].get('nodeName')}"

    def gone(self, kind: str, name: str, namespaced: bool = True) -> None:
        self.until(f"{kind} {name} gone", lambda: (
            self.get(kind, name) if namespaced else get(self.kc, kind, name)) is None)


@pytest.fixture
def cluster(sandbox: Sandbox, tenant: Callable[[], Tenant]) -> Cluster:
    return Cluster(sandbox, tenant())


class Controller:
    """The sandbox's `egpu controller`: SIGKILLed (nothing released) and started again with
    the command line it had; the fixture leaves it running."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.down = False

    def kill(self) -> None:
        components.kill(self.state_dir, CONTROLLER)
        self.down = True

    def restart(self) -> None:
        components.restart(self.state_dir, CONTROLLER)
        self.down = False


@pytest.fixture
def controller(sandbox: Sandbox) -> Iterator[Controller]:
    control = Controller(sandbox.state_dir)
    try:
        yield control
    finally:
        if control.down:
            control.restart()


@pytest.fixture(scope="module")
def nodes(sandbox: Sandbox) -> list[str]:
    found = gpu_nodes(sandbox.kubeconfig)
    assert len(found) >= 4, found
    return found


def make_class(kc: Path, name: str, mode: str, parameters: dict[str, str] | None = None) -> str:
    body: dict[str, Any] = {"apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPUClass",
                            "metadata": {"name": name},
                            "provisioner": "gpu.provisioner.elasticgpu.io",
                            "reclaimPolicy": "Delete", "egpuBindingMode": mode}
    if parameters:
        body["parameters"] = parameters
    if get(kc, "egpuclass", name) is None:
        kubectl(kc, "create", "-f", "-", input=json.dumps(body))
    return name


# ------------------------------------------------------------------------------- item 2


def test_a_claim_deleted_under_its_running_pod_stays_and_keeps_its_card(
        cluster: Cluster, nodes: list[str], controller: Controller) -> None:
    c, t, node = cluster, cluster.tenant, nodes[0]
    cls = make_class(c.kc, "outage-wffc", "WaitForFirstConsumer")
    controller.kill()
    t.ok("create", "-f", "-", input=claim("mine", cls))
    made = c.get("egpuc", "mine")
    assert made is not None
    # the controller is down: the finalizer is there from creation, by the webhook
    assert CLAIM_PROTECTION_FINALIZER in (made["metadata"].get("finalizers") or []), made
    t.ok("create", "-f", "-", input=pod("user", node, claim="mine"))
    user = c.bound("user")  # the extender provisioned the claim at bind
    egpu = assignment(user)["claims"]["main"]
    (card,) = cards_of(user)
    t.ok("create", "-f", "-", input=pod("filler", node, cards=7))
    assert card not in cards_of(c.bound("filler"))
    t.ok("delete", "egpuc", "mine", "--wait=false")
    kept = c.get("egpuc", "mine")
    assert kept is not None and kept["metadata"].get("deletionTimestamp"), \
        "the claim vanished under its running pod"

    controller.restart()  # it must keep the claim and the ElasticGPU
    c.until("the controller to hold the claim for its pod",
            lambda: "WaitingForPods" in reasons(c.kc, c.ns, "mine"))
    # and finish its binding: it says which ElasticGPU its pod holds (issue #39)
    held = c.until("the claim Bound to its pod's ElasticGPU", lambda: (
        (k := c.get("egpuc", "mine")) is not None
        and (k.get("status") or {}).get("phase") == "Bound" and k))
    assert held["spec"]["elasticGPUName"] == held["status"]["elasticGPUName"] == egpu
    assert held["metadata"].get("deletionTimestamp")
    assert get(c.kc, "egpu", egpu) is not None, "the ElasticGPU was reclaimed under its pod"
    t.ok("create", "-f", "-", input=pod("pinned", node, cards=1))
    c.turned_away("pinned")  # the node's only card not taken by filler is the user's

    t.ok("delete", "pod", "user", "--wait=false")
    c.gone("egpuc", "mine")
    c.gone("egpu", egpu, namespaced=False)  # reclaim Delete, now that no pod uses it
    assert cards_of(c.bound("pinned")) == {card}


def test_a_stripped_finalizer_and_a_deleted_elasticgpu_take_no_card_from_its_pod(
        cluster: Cluster, nodes: list[str]) -> None:
    """A tenant with edit may remove the claim's finalizer, an admin may delete an
    ElasticGPU by mistake: neither hands out a card a running pod uses."""
    c, t, node = cluster, cluster.tenant, nodes[1]
    cls = make_class(c.kc, "outage-wffc", "WaitForFirstConsumer")
    t.ok("create", "-f", "-", input=claim("mine", cls))
    t.ok("create", "-f", "-", input=pod("user", node, claim="mine"))
    user = c.bound("user")
    egpu = assignment(user)["claims"]["main"]
    (card,) = cards_of(user)
    t.ok("create", "-f", "-", input=pod("filler", node, cards=7))
    c.bound("filler")
    t.ok("delete", "egpuc", "mine", "--wait=false")
    t.ok("patch", "egpuc", "mine", "--type=json",
         "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    c.gone("egpuc", "mine")
    # the controller sees the claim gone, and keeps the ElasticGPU for its pod
    until(c.kc, c.ns, "the controller to keep the ElasticGPU for its pod",
          lambda: "WaitingForPods" in reasons(c.kc, "default", egpu))
    assert get(c.kc, "egpu", egpu) is not None, "the ElasticGPU was reclaimed under its pod"
    kubectl(c.kc, "delete", "egpu", egpu)  # the admin's mistake
    t.ok("create", "-f", "-", input=pod("pinned", node, cards=1))
    c.turned_away("pinned")  # the card is still the running pod's

    t.ok("delete", "pod", "user", "--wait=false")
    assert cards_of(c.bound("pinned")) == {card}


def test_claims_of_pending_pods_are_protected_from_creation_and_wait_for_them(
        cluster: Cluster) -> None:
    c, t = cluster, cluster.tenant
    # an Immediate class no node can serve: its claims stay Pending, Unschedulable
    cls = make_class(c.kc, "outage-nowhere", "Immediate", {"models": "NoSuchModel"})
    names = [f"claim-{i}" for i in range(3)]
    for name in names:
        t.ok("create", "-f", "-", input=claim(name, cls))
        t.ok("create", "-f", "-", input=pod(f"pod-{name}", "any-node", claim=name))
    for name in names:
        c.until(f"claim {name} Unschedulable", lambda name=name: any(
            cond.get("reason") == "Unschedulable" for cond in
            ((c.get("egpuc", name) or {}).get("status") or {}).get("conditions") or []))
        found = c.get("egpuc", name)
        assert found is not None
        assert CLAIM_PROTECTION_FINALIZER in (found["metadata"].get("finalizers") or [])
    t.ok("delete", "egpuc", "--all", "--wait=false")
    for name in names:
        c.until(f"the controller to hold claim {name} for its Pending pod",
                lambda name=name: "WaitingForPods" in reasons(c.kc, c.ns, name))
        found = c.get("egpuc", name)
        assert found is not None and found["metadata"].get("deletionTimestamp")
    for name in names:
        t.ok("delete", "pod", f"pod-{name}", "--wait=false")
    for name in names:
        c.gone("egpuc", name)


# ------------------------------------------------------------------------------- item 3


def test_without_a_budget_a_deleted_pod_frees_its_card_while_the_controller_is_down(
        cluster: Cluster, nodes: list[str], controller: Controller) -> None:
    c, t, node = cluster, cluster.tenant, nodes[2]
    controller.kill()
    t.ok("create", "-f", "-", input=pod("holder", node, cards=8))
    holder = c.bound("holder")
    assert BUDGET_FINALIZER not in (holder["metadata"].get("finalizers") or [])
    t.ok("create", "-f", "-", input=pod("waiter", node, cards=1))
    c.turned_away("waiter")
    t.ok("delete", "pod", "holder", "--wait=false")
    c.bound("waiter")
    c.gone("pod", "holder")


def test_with_a_budget_the_card_is_free_once_the_containers_stop_whatever_the_finalizer(
        cluster: Cluster, nodes: list[str], controller: Controller) -> None:
    """The waiter uses a WaitForFirstConsumer claim, so kube-scheduler's node-level count
    (`node.elasticgpu.io/gpu-core`, 0 for a claim-backed container) does not stand in the
    way and the test shows the extender's own decision: kube-scheduler counts a pod until it
    is gone or its phase is terminal, which a kubelet sets once a deleted pod's containers
    have stopped; the status here says only that the container stopped."""
    c, t, node = cluster, cluster.tenant, nodes[3]
    cls = make_class(c.kc, "outage-wffc", "WaitForFirstConsumer")
    kubectl(c.kc, "create", "-f", "-", input=json.dumps({
        "apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
        "metadata": {"name": "budget", "namespace": c.ns},
        "spec": {"gpuHours": 100, "period": "24h"}}))

    def finalized_on_create() -> bool:
        dry = t.run("create", "--dry-run=server", "-o", "json", "-f", "-",
                    input=pod("holder", node, cards=8))
        return dry.returncode == 0 and \
            BUDGET_FINALIZER in (json.loads(dry.stdout)["metadata"].get("finalizers") or [])

    c.until("the webhook to know the namespace's GPUBudget", finalized_on_create)
    t.ok("create", "-f", "-", input=pod("holder", node, cards=8))
    holder = c.bound("holder")
    assert BUDGET_FINALIZER in (holder["metadata"].get("finalizers") or [])
    c.until("kwok to start holder", lambda: (c.get("pod", "holder") or {}).get(
        "status", {}).get("containerStatuses"))

    controller.kill()
    t.ok("create", "-f", "-", input=claim("wanted", cls))
    t.ok("create", "-f", "-", input=pod("waiter", node, claim="wanted"))
    c.turned_away("waiter")
    t.ok("delete", "pod", "holder", "--wait=false")
    deleting = c.get("pod", "holder")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    found = c.get("pod", "waiter")
    assert found is not None and not found["spec"].get("nodeName"), \
        "the waiter got a card of a pod whose container still runs"
    # the container stops (kwok has no kubelet to report it: the test does)
    started = deleting["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    kubectl(c.kc, "patch", "pod", "holder", "-n", c.ns, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"containerStatuses": [{
                "name": "main", "image": "busybox", "imageID": "", "ready": False,
                "restartCount": 0, "started": False, "state": {"terminated": {
                    "exitCode": 137, "reason": "Error", "startedAt": started,
                    "finishedAt": deleting["metadata"]["deletionTimestamp"]}}}]}}))
    c.bound("waiter")
    # the finalizer still holds the object (its usage is not settled yet): lossless
    held = c.get("pod", "holder")
    assert held is not None and BUDGET_FINALIZER in held["metadata"]["finalizers"]
    controller.restart()  # the keeper settles the pod and lets it go
    c.gone("pod", "holder")
