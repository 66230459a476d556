"""Issue #26 items 4 (the controller's side) and 5 on the real control plane, with `egpu
controller --only mig` running against kube-apiserver:

- a MIGSubstitution an admin wrote by hand (no `app.kubernetes.io/managed-by` label of the
  adapter) whose savedPod is privileged with hostPath `/` is never turned into a pod: the rule
  gets `Valid=False` (NotWrittenByAdapter) and a Warning Event;
- a rule naming someone's pending pod with a manifest of another image does not replace it,
  neither without the label nor with a copied label and the victim's uid (PodMismatch);
- bad rules (a saved manifest that does not match its recorded digest, one that asks no MIG
  profile of the rule) fail alone with their reasons while a good rule beside them proceeds
  (its pod is re-created from it).

Without the fix the controller created the privileged pod, deleted the victim and created it
again with the other image, and created pods from the bad rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.api import migsubstitution as api
from elastic_gpu.core.annotations import MANAGED_BY
from elastic_gpu.core.mig.rules import ADAPTER, saved_pod, saved_pod_digest
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

FAKE_UID = "0a1b2c3d-0000-4000-8000-0123456789ab"


@pytest.fixture
def controller(k8s_cluster: Any, tmp_path: Path) -> Iterator[ControllerProcess]:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    (port,) = free_ports(1)
    process = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                                extender_url="http://127.0.0.1:1",
                                identity=unique_name("mig"), lease_name=unique_name("mig-trust"),
                                lease=(4, 3, 0.5), extra=["--only", "mig"])
    process.start()
    try:
        wait_for("the controller leading", process.leading, 120)
        yield process
    finally:
        process.stop()


def mig_pod(name: str, image: str = "busybox") -> dict[str, Any]:
    mig = {"nvidia.com/mig-1g.10gb": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeSelector": {"nowhere": "true"}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": image,
                                     "resources": {"limits": dict(mig),
                                                   "requests": dict(mig)}}]}}


def privileged(name: str) -> dict[str, Any]:
    pod = mig_pod(name, "busybox")
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "root", "mountPath": "/host"}]
    pod["spec"]["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    return pod


def rule(name: str, pod_name: str, manifest: dict[str, Any], uid: str, *, labelled: bool,
         digest: str | None = None) -> str:
    saved = saved_pod(manifest)
    meta: dict[str, Any] = {"name": name}
    if labelled:
        meta["labels"] = {MANAGED_BY: ADAPTER}
    return json.dumps({
        "apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND, "metadata": meta,
        "spec": {"selector": {"podName": pod_name}, "fromProfile": "1g.10gb",
                 "toProfile": "2g.20gb", "reason": "written by the test", "savedPod": saved,
                 "savedPodDigest": digest or saved_pod_digest(saved), "movedPodUID": uid}})


def pod_or_none(plane: Any, ns: str, name: str) -> dict[str, Any] | None:
    result = plane.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def refused(plane: Any, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    """The rule once it says `Valid=False` with `reason`, and a Warning Event says so too."""
    got = plane.kubectl("get", api.SHORT, name, "-n", ns, "-o", "json", check=False)
    if got.returncode != 0:  # the controller deletes a rule it has carried out
        pods = plane.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
        raise AssertionError(f"rule {name} is gone: the controller carried it out instead of "
                             f"refusing it ({got.stderr.strip()}); pods:\n{pods}")
    obj = json.loads(got.stdout)
    conditions = (obj.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Valid" and c.get("status") == "False"
               and c.get("reason") == reason for c in conditions):
        return None
    events = json.loads(plane.kubectl(
        "get", "events", "-n", ns, "-o", "json",
        f"--field-selector=involvedObject.name={name},reason={reason},type=Warning").stdout)
    return obj if events["items"] else None


def test_an_admin_written_rule_never_turns_into_a_pod(
        k8s_cluster: Any, k8s_namespace: str, controller: ControllerProcess) -> None:
    plane, ns = k8s_cluster, k8s_namespace
    plane.kubectl("create", "-n", ns, "-f", "-",
                  input=rule("root", "evil", privileged("evil"), FAKE_UID, labelled=False))
    obj = wait_for("the hand-written rule marked NotWrittenByAdapter",
                   lambda: refused(plane, ns, "root", "NotWrittenByAdapter"), 120)
    (cond,) = [c for c in obj["status"]["conditions"] if c["type"] == "Valid"]
    assert f"{MANAGED_BY}={ADAPTER}" in cond["message"], cond
    # the controller has judged it (the condition is its round's work) and created nothing
    assert pod_or_none(plane, ns, "evil") is None, "the controller created the rule's pod"


def test_a_rule_naming_someones_pending_pod_does_not_replace_it(
        k8s_cluster: Any, k8s_namespace: str, controller: ControllerProcess) -> None:
    plane, ns = k8s_cluster, k8s_namespace
    plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mig_pod("victim")))
    victim = wait_for("the victim Pending and Unschedulable", lambda: (
        (p := pod_or_none(plane, ns, "victim")) is not None and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (p.get("status") or {}).get("conditions") or []) and p), 120)
    uid = victim["metadata"]["uid"]
    # by hand, and with the adapter's label copied and the victim's uid: another image
    plane.kubectl("create", "-n", ns, "-f", "-",
                  input=rule("swap-a", "victim", mig_pod("victim", "evil:latest"), uid,
                             labelled=False))
    plane.kubectl("create", "-n", ns, "-f", "-",
                  input=rule("swap-b", "victim", mig_pod("victim", "evil:latest"), uid,
                             labelled=True))
    wait_for("the unlabelled rule refused",
             lambda: refused(plane, ns, "swap-a", "NotWrittenByAdapter"), 120)
    obj = wait_for("the forged rule refused as PodMismatch",
                   lambda: refused(plane, ns, "swap-b", "PodMismatch"), 120)
    (cond,) = [c for c in obj["status"]["conditions"] if c["type"] == "Valid"]
    assert "spec.containers" in cond["message"], cond
    now = pod_or_none(plane, ns, "victim")
    assert now is not None and now["metadata"]["uid"] == uid, \
        f"the victim was replaced: {now and now['metadata']}"
    assert now["spec"]["containers"][0]["image"] == "busybox"


def test_a_bad_rule_fails_alone_and_a_good_one_proceeds(
        k8s_cluster: Any, k8s_namespace: str, controller: ControllerProcess) -> None:
    plane, ns = k8s_cluster, k8s_namespace
    # sorted before the good one: the round meets them first
    plane.kubectl("create", "-n", ns, "-f", "-", input=rule(
        "a-edited", "edited", mig_pod("edited"), FAKE_UID, labelled=True,
        digest=saved_pod_digest(saved_pod(mig_pod("edited", "other")))))
    no_mig = mig_pod("nomig")
    no_mig["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    plane.kubectl("create", "-n", ns, "-f", "-",
                  input=rule("b-nomig", "nomig", no_mig, FAKE_UID, labelled=True))
    plane.kubectl("create", "-n", ns, "-f", "-",
                  input=rule("c-good", "good", mig_pod("good"), FAKE_UID, labelled=True))
    good = wait_for("the good rule's pod re-created from it",
                    lambda: pod_or_none(plane, ns, "good"), 120)
    assert good["spec"]["containers"][0]["image"] == "busybox"
    obj = wait_for("the edited rule refused", lambda: refused(plane, ns, "a-edited",
                                                              "SavedPodUnverified"), 120)
    assert "spec.savedPodDigest" in json.dumps(obj["status"]), obj["status"]
    obj = wait_for("the rule asking no MIG refused",
                   lambda: refused(plane, ns, "b-nomig", "InvalidSpec"), 120)
    assert "asks no nvidia.com/mig-1g.10gb" in json.dumps(obj["status"]), obj["status"]
    for name in ("edited", "nomig"):
        assert pod_or_none(plane, ns, name) is None, f"a pod was created from the bad rule {name}"


def _loose_crd() -> dict[str, Any]:
    """The MIGSubstitution CRD as it was before issue #26 (savedPod any object, no rule tying
    it to podName): what rules stored before the upgrade went through."""
    import copy

    crd = copy.deepcopy(api.crd_manifest())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["x-kubernetes-validations"] = spec["x-kubernetes-validations"][:2]  # immutable, from!=to
    spec["properties"]["savedPod"] = {"type": "object",
                                      "x-kubernetes-preserve-unknown-fields": True}
    return crd


def test_rules_the_schema_no_longer_admits_fail_alone(
        k8s_cluster: Any, k8s_namespace: str, controller: ControllerProcess) -> None:
    """Issue #26 item 5 as reported: `podName: nopod` without `savedPod`, and `savedPod: {spec:
    "x"}`, stored (here under the CRD as it was before; in a cluster, before the upgrade) made
    every round fail, so later rules waited. Each is refused alone and a good rule proceeds."""
    from elastic_gpu.kube.crds import install_crds

    plane, ns = k8s_cluster, k8s_namespace
    label = {MANAGED_BY: ADAPTER}
    bad = {"a-nopod": {"selector": {"podName": "nopod"}, "fromProfile": "1g.10gb",
                       "toProfile": "2g.20gb"},
           "b-specx": {"selector": {"podName": "p"}, "fromProfile": "1g.10gb",
                       "toProfile": "2g.20gb", "savedPod": {"spec": "x"}}}
    install_crds(plane.kube(), [_loose_crd()])
    try:
        for name, spec in bad.items():  # (the apiserver serves the new schema a moment later)
            body = json.dumps({"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
                               "metadata": {"name": name, "labels": label}, "spec": spec})
            wait_for(f"rule {name} stored under the loose schema", lambda b=body: plane.kubectl(
                "create", "-n", ns, "-f", "-", input=b, check=False).returncode == 0, 60)
    finally:
        install_crds(plane.kube(), [api.crd_manifest()])
    plane.kubectl("create", "-n", ns, "-f", "-",
                  input=rule("c-good", "good", mig_pod("good"), FAKE_UID, labelled=True))
    wait_for("the good rule's pod created despite the bad rules before it",
             lambda: pod_or_none(plane, ns, "good"), 120)
    for name, words in (("a-nopod", "spec.savedPod is missing"),
                        ("b-specx", "spec.savedPod.metadata=None is not an object")):
        obj = wait_for(f"rule {name} refused", lambda n=name: refused(plane, ns, n,
                                                                      "InvalidSpec"), 120)
        assert words in json.dumps(obj["status"]), obj["status"]
    assert pod_or_none(plane, ns, "nopod") is None and pod_or_none(plane, ns, "p") is None
    assert "mig round failed" not in controller.log_path.read_text()
