"""The MIG rewrite through `egpu webhook` registered on the real kube-apiserver (issue #16): a
MIGSubstitution in the API rewrites the pods it selects as they are created, the original
request kept in an annotation; pods it does not select are stored as written."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from egpu_testing.seed import seed_pod
from egpu_testing.webhook import WebhookProcess, running_webhook
from elastic_gpu.api import migsubstitution as api
from elastic_gpu.core.mig.rules import MIG_ORIGINAL, MIG_SUBSTITUTION
from elastic_gpu.core.nodefit import NODE_CORE

pytestmark = pytest.mark.integration

LABEL = "egpu-webhook-mig-test"
OWNER = "6f1c2a3b-0000-4000-8000-0123456789ab"


@pytest.fixture(scope="module")
def webhook(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[WebhookProcess]:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    with running_webhook(k8s_cluster, tmp_path_factory.mktemp("webhook"), "egpu-webhook-mig",
                         LABEL) as hook:
        yield hook


def mig_pod(name: str, owner: str | None = None) -> dict[str, Any]:
    mig = {"nvidia.com/mig-1g.10gb": "1"}
    meta: dict[str, Any] = {"name": name, "labels": {"app": "train"},
                            "annotations": {"note": "mine"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": "web", "uid": owner}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": dict(mig), "requests": dict(mig)}}]}}


def saved(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    """A bare pod's record in its rule, as the adapter writes it (savedPod, its digest, the
    uid of the pod deleted)."""
    from elastic_gpu.core.mig.rules import saved_pod, saved_pod_digest

    manifest = saved_pod(pod)
    return {"savedPod": manifest, "savedPodDigest": saved_pod_digest(manifest),
            "movedPodUID": uid}


def created(plane: Any, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as kube-apiserver would store it (a server-side dry run: every webhook runs)."""
    out = plane.kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                        input=json.dumps(pod)).stdout
    stored: dict[str, Any] = json.loads(out)
    return stored


def test_a_rule_rewrites_the_pods_it_selects(k8s_cluster: Any, k8s_namespace: str,
                                             webhook: WebhookProcess) -> None:
    plane = k8s_cluster
    plane.kubectl("label", "namespace", k8s_namespace, f"{LABEL}={webhook.name}")
    deadline = time.monotonic() + 30
    while "rule claim-not-found" not in plane.kubectl(
            "create", "--dry-run=server", "-n", k8s_namespace, "-f", "-",
            input=seed_pod("probe", "no-such-claim"), check=False).stderr:
        assert time.monotonic() < deadline, "webhook not in force"
        time.sleep(0.2)
    # before any rule: stored as written
    plain = created(plane, k8s_namespace, mig_pod("train-0"))
    assert plain["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1",
                                                                     NODE_CORE: "14"}
    for name, selector in (("bare", {"podName": "train-0"}), ("web", {"ownerUID": OWNER})):
        spec: dict[str, Any] = {"selector": selector, "fromProfile": "1g.10gb",
                                "toProfile": "2g.20gb", "reason": "test"}
        if "podName" in selector:  # the schema wants a bare pod's rule as the adapter writes it
            spec.update(saved(mig_pod("train-0"), OWNER))
        plane.kubectl("create", "-n", k8s_namespace, "-f", "-", input=json.dumps({
            "apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
            "metadata": {"name": name}, "spec": spec}))
    started = time.monotonic()
    while True:  # the webhook's watch delivers the rules
        bare = created(plane, k8s_namespace, mig_pod("train-0"))
        if "nvidia.com/mig-2g.20gb" in bare["spec"]["containers"][0]["resources"]["limits"]:
            break
        assert time.monotonic() - started < 10, "the rule was not applied within 10 s"
        time.sleep(0.1)
    for pod, rule in ((bare, "bare"), (created(plane, k8s_namespace, mig_pod("web-x", OWNER)),
                                       "web")):
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources == {"limits": {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"},
                             "requests": {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"}}
        assert pod["metadata"]["annotations"] == {"note": "mine", MIG_ORIGINAL: "main=1g.10gb",
                                                  MIG_SUBSTITUTION: rule}
        assert pod["metadata"]["labels"] == {"app": "train"}
    # not selected: another name, another owner
    for other in (mig_pod("train-1"), mig_pod("web-y", "00000000-0000-4000-8000-000000000000")):
        kept = created(plane, k8s_namespace, other)
        assert kept["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/mig-1g.10gb": "1", NODE_CORE: "14"}
        assert MIG_ORIGINAL not in kept["metadata"]["annotations"]


def test_a_bare_pod_saved_in_its_rule_comes_back_rewritten_under_its_name(
        k8s_cluster: Any, k8s_namespace: str, webhook: WebhookProcess) -> None:
    """The bare-pod move without the controller: the live pod saved in the rule, deleted,
    re-created from the rule as the API serves it: same name, labels, annotations and spec
    apart from the profile (the controller loop will do exactly these steps)."""
    from elastic_gpu.core.mig.rules import recreated_pod

    plane = k8s_cluster
    plane.kubectl("label", "namespace", k8s_namespace, f"{LABEL}={webhook.name}")
    original = mig_pod("train-0")
    original["spec"]["containers"][0]["args"] = ["--epochs", "3"]
    deadline = time.monotonic() + 30
    while "rule claim-not-found" not in plane.kubectl(
            "create", "--dry-run=server", "-n", k8s_namespace, "-f", "-",
            input=seed_pod("probe", "no-such-claim"), check=False).stderr:
        assert time.monotonic() < deadline, "webhook not in force"
        time.sleep(0.2)
    plane.kubectl("create", "-n", k8s_namespace, "-f", "-", input=json.dumps(original))
    live = json.loads(plane.kubectl("get", "pod", "train-0", "-n", k8s_namespace,
                                    "-o", "json").stdout)
    plane.kubectl("create", "-n", k8s_namespace, "-f", "-", input=json.dumps({
        "apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND, "metadata": {"name": "bare"},
        "spec": {"selector": {"podName": "train-0"}, "fromProfile": "1g.10gb",
                 "toProfile": "2g.20gb", **saved(live, live["metadata"]["uid"])}}))
    plane.kubectl("delete", "pod", "train-0", "-n", k8s_namespace, "--grace-period=0",
                  "--force", "--wait=true")
    rule = api.rule_from_object(json.loads(plane.kubectl(
        "get", api.SHORT, "bare", "-n", k8s_namespace, "-o", "json").stdout))
    again = recreated_pod(rule)
    started = time.monotonic()
    while True:  # the webhook's watch has the rule
        stored = created(plane, k8s_namespace, again)
        if "nvidia.com/mig-2g.20gb" in stored["spec"]["containers"][0]["resources"]["limits"]:
            break
        assert time.monotonic() - started < 10, "the rule was not applied within 10 s"
        time.sleep(0.1)
    plane.kubectl("create", "-n", k8s_namespace, "-f", "-", input=json.dumps(again))
    back = json.loads(plane.kubectl("get", "pod", "train-0", "-n", k8s_namespace,
                                    "-o", "json").stdout)
    assert back["metadata"]["uid"] != live["metadata"]["uid"]
    assert back["metadata"]["labels"] == live["metadata"]["labels"]
    assert back["metadata"]["annotations"] == {"note": "mine", MIG_ORIGINAL: "main=1g.10gb",
                                               MIG_SUBSTITUTION: "bare"}
    container, before = back["spec"]["containers"][0], live["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"},
                                      "requests": {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"}}
    assert {k: v for k, v in container.items() if k != "resources"} == {
        k: v for k, v in before.items() if k != "resources"}
    assert {k: v for k, v in back["spec"].items() if k != "containers"} == {
        k: v for k, v in live["spec"].items() if k != "containers"}
