"""The MIGSubstitution CRD on the real kube-apiserver (issue #16, the rule in the API)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elastic_gpu.api import migsubstitution as api

pytestmark = pytest.mark.integration

UID = "6f1c2a3b-0000-4000-8000-0123456789ab"
DIGEST = "sha256:" + "0" * 64


def pod_named(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "main",
                                                                  "image": "busybox"}]}}


@pytest.fixture
def crds(k8s_cluster: Any) -> Any:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())  # what the sandbox installs
    return k8s_cluster


def _rule(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
                       "metadata": {"name": name}, "spec": spec})


def test_a_rule_is_served_read_and_printed(crds: Any, k8s_namespace: str) -> None:
    spec = {"selector": {"ownerUID": UID}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
            "reason": "no 1g.10gb free"}
    crds.kubectl("create", "-n", k8s_namespace, "-f", "-", input=_rule("web", spec))
    obj = json.loads(crds.kubectl("get", api.SHORT, "web", "-n", k8s_namespace,
                                  "-o", "json").stdout)
    rule = api.rule_from_object(obj)
    assert (rule.namespace, rule.owner_uid, rule.from_profile.name, rule.to_profile.name) == (
        k8s_namespace, UID, "1g.10gb", "2g.20gb")
    out = crds.kubectl("get", api.SHORT, "-n", k8s_namespace).stdout
    assert out.split("\n")[0].split() == ["NAME", "FROM", "TO", "OWNER", "POD", "MOVED", "AGE"]
    assert out.split("\n")[1].split()[:4] == ["web", "1g.10gb", "2g.20gb", UID]
    # the spec cannot change: a rule is replaced, never edited under the pods it moved
    result = crds.kubectl("patch", api.SHORT, "web", "-n", k8s_namespace, "--type=merge",
                          "-p", '{"spec":{"toProfile":"3g.40gb"}}', check=False)
    assert result.returncode != 0 and "spec is immutable" in result.stderr


@pytest.mark.parametrize(("spec", "words"), [
    ({"selector": {"ownerUID": UID}, "fromProfile": "1g.10gb", "toProfile": "1g.10gb"},
     ["toProfile must differ from fromProfile"]),
    ({"selector": {}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb"},
     ["spec.selector", "exactly one of ownerUID and podName"]),
    ({"selector": {"ownerUID": UID, "podName": "p"}, "fromProfile": "1g.10gb",
      "toProfile": "2g.20gb"}, ["exactly one of ownerUID and podName"]),
    ({"selector": {"podName": "p"}, "fromProfile": "nvidia.com/mig-1g.10gb",
      "toProfile": "2g.20gb"}, ["spec.fromProfile", "should match"]),
    ({"selector": {"podName": "p"}, "fromProfile": "8g.10gb", "toProfile": "2g.20gb"},
     ["spec.fromProfile"]),
    ({"selector": {"ownerUID": "not-a-uid"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb"},
     ["spec.selector.ownerUID"]),
    ({"selector": {"podName": "p"}, "toProfile": "2g.20gb"}, ["spec.fromProfile", "Required"]),
    ({"selector": {"ownerUID": UID}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": pod_named("p"), "savedPodDigest": DIGEST, "movedPodUID": UID},
     ["savedPod goes with selector.podName"]),
    # issue #26 item 5: what the adapter could not carry out is refused at create
    ({"selector": {"podName": "nopod"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb"},
     ["savedPod goes with selector.podName"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": {"spec": "x"}, "savedPodDigest": DIGEST, "movedPodUID": UID},
     ["spec.savedPod.spec: Invalid value", "object", "spec.savedPod.metadata: Required value"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": {"metadata": {"name": "p"}, "spec": {"containers": []}},
      "savedPodDigest": DIGEST, "movedPodUID": UID},
     ["spec.savedPod.spec.containers", "at least 1"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": pod_named("other"), "savedPodDigest": DIGEST, "movedPodUID": UID},
     ["savedPod.metadata.name must be selector.podName"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": pod_named("p"), "movedPodUID": UID}, ["savedPodDigest goes with savedPod"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": pod_named("p"), "savedPodDigest": "md5:x", "movedPodUID": UID},
     ["spec.savedPodDigest", "should match"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "savedPod": pod_named("p"), "savedPodDigest": DIGEST}, ["movedPodUID goes with savedPod"]),
    ({"selector": {"podName": "p"}, "fromProfile": "1g.10gb", "toProfile": "2g.20gb",
      "reason": "x" * 1025}, ["spec.reason", "1024"]),
])
def test_nonsense_rules_are_refused(crds: Any, k8s_namespace: str, spec: dict[str, Any],
                                    words: list[str]) -> None:
    result = crds.kubectl("create", "-n", k8s_namespace, "-f", "-", input=_rule("bad", spec),
                          check=False)
    assert result.returncode != 0, result.stdout
    for word in words:
        assert word in result.stderr, result.stderr
    assert "is invalid" in result.stderr  # 422 Invalid, naming the field and the rule


def test_the_webhooks_deployed_rbac_may_watch_the_rules(crds: Any) -> None:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    crds.kubectl("create", "namespace", "elastic-gpu", check=False)
    crds.kubectl("apply", "-f", str(repo / "deploy/webhook/rbac.yaml"))
    who = "--as=system:serviceaccount:elastic-gpu:elastic-gpu-webhook"
    for verb in ("list", "watch"):
        result = crds.kubectl("auth", "can-i", verb, f"{api.PLURAL}.elasticgpu.io", "-A", who,
                              check=False)
        assert result.stdout.strip() == "yes", (verb, result.stdout, result.stderr)
    assert crds.kubectl("auth", "can-i", "create", f"{api.PLURAL}.elasticgpu.io", "-A", who,
                        check=False).stdout.strip() == "no"


def test_the_controllers_deployed_rbac_allows_every_call_of_the_mig_adapter(crds: Any) -> None:
    """What `controller/mig/` calls, asked of the deployed ClusterRole (the chart's is equal,
    a unit test says so) by `kubectl auth can-i` as its ServiceAccount."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    crds.kubectl("create", "namespace", "elastic-gpu", check=False)
    crds.kubectl("apply", "-f", str(repo / "deploy/controller/rbac.yaml"))
    crds.kubectl("apply", "-f", str(repo / "deploy/crds/gpudevices.yaml"))
    crds.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                 "crd/gpudevices.elasticgpu.io")
    who = "--as=system:serviceaccount:elastic-gpu:elastic-gpu-controller"
    wanted = [(verb, "pods") for verb in ("get", "list", "watch", "create", "delete")]
    wanted += [(verb, "nodes") for verb in ("list", "watch")]
    wanted += [(verb, "gpudevices.elasticgpu.io") for verb in ("list", "watch")]
    wanted += [(verb, f"{api.PLURAL}.elasticgpu.io")
               for verb in ("get", "list", "watch", "create", "patch", "delete")]
    wanted += [("patch", f"{api.PLURAL}.elasticgpu.io/status"), ("create", "events"),
               ("patch", "events")]
    for verb, resource in wanted:
        result = crds.kubectl("auth", "can-i", verb, resource, "-A", who, check=False)
        assert result.stdout.strip() == "yes", (verb, resource, result.stdout, result.stderr)
    for verb, resource in (("update", "pods"), ("delete", "nodes"),
                           ("update", f"{api.PLURAL}.elasticgpu.io")):
        result = crds.kubectl("auth", "can-i", verb, resource, "-A", who, check=False)
        assert result.stdout.strip() == "no", (verb, resource, result.stdout)
