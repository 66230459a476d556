"""Pods naming ElasticGPUClaims through `egpu webhook` registered on the real kube-apiserver
(issue #15): the seed README's pod is stored with its claim's resources, a pod naming a missing
claim is refused by `kubectl create` with the message, and a claim created just before its pod
is found (a live read when the watch has not delivered it yet)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.seed import SEED_CLASS, seed_claim, seed_pod
from egpu_testing.webhook import WebhookProcess, running_webhook

pytestmark = pytest.mark.integration

LABEL = "egpu-webhook-claims-test"
SHARE = {"elasticgpu.io/gpu-core": "10", "elasticgpu.io/gpu-memory": "4"}


@pytest.fixture(scope="module")
def webhook(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[WebhookProcess]:
    install_crds(k8s_cluster)
    with running_webhook(k8s_cluster, tmp_path_factory.mktemp("webhook"), "egpu-webhook-claims",
                         LABEL) as hook:
        yield hook


@pytest.fixture
def claims_ns(k8s_cluster: Any, k8s_namespace: str, webhook: WebhookProcess) -> str:
    """A namespace the webhook governs, once kube-apiserver sends it there: a server-side dry
    run of a pod naming a missing claim is refused by our rule."""
    k8s_cluster.kubectl("label", "namespace", k8s_namespace, f"{LABEL}={webhook.name}")
    probe = seed_pod("probe", "no-such-claim")
    deadline = time.monotonic() + 30
    while True:
        result = k8s_cluster.kubectl("create", "--dry-run=server", "-n", k8s_namespace, "-f",
                                     "-", input=probe, check=False)
        if "rule claim-not-found" in result.stderr:
            break
        assert time.monotonic() < deadline, f"webhook not in force: {result.stderr}"
        time.sleep(0.2)
    k8s_cluster.kubectl("apply", "-f", "-", input=SEED_CLASS)
    return k8s_namespace


def stored_resources(plane: Any, namespace: str, pod: str) -> dict[str, Any]:
    obj = json.loads(plane.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)
    resources: dict[str, Any] = obj["spec"]["containers"][0]["resources"]
    return resources


def test_the_seed_readme_pod_is_stored_with_its_claims_resources(
        k8s_cluster: Any, claims_ns: str, webhook: WebhookProcess) -> None:
    k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-",
                        input=seed_claim("gpushare-egpuc-1"))
    # the watch has it before the pod comes (a cache hit: no live read)
    deadline = time.monotonic() + 10
    while "gpushare-egpuc-1" not in k8s_cluster.kubectl(
            "get", "egpuc", "-n", claims_ns, "-o", "name").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)  # let the watch deliver it
    reads_before = webhook.metric("elasticgpu_webhook_claim_lookups_total", 'source="api"')
    result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-",
                                 input=seed_pod("test-cuda-1", "gpushare-egpuc-1"), check=False)
    assert result.returncode == 0, result.stderr
    assert stored_resources(k8s_cluster, claims_ns, "test-cuda-1") == {
        "limits": SHARE, "requests": SHARE}
    assert webhook.metric("elasticgpu_webhook_claim_lookups_total", 'source="cache"') >= 1
    assert webhook.metric("elasticgpu_webhook_claim_lookups_total",
                          'source="api"') == reads_before


def test_a_pod_naming_a_missing_claim_is_refused_with_the_message(
        k8s_cluster: Any, claims_ns: str) -> None:
    result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-",
                                 input=seed_pod("test-cuda-2", "gpushare-egpuc-2"), check=False)
    assert result.returncode != 0
    assert 'admission webhook "pods.mutate.elasticgpu.io" denied the request' in result.stderr
    assert (f"container test-cuda: egpuc.elasticgpu.io/test1=gpushare-egpuc-2: ElasticGPUClaim "
            f"gpushare-egpuc-2 does not exist in namespace {claims_ns}; create it first "
            "(rule claim-not-found)") in result.stderr
    assert k8s_cluster.kubectl("get", "pod", "test-cuda-2", "-n", claims_ns,
                               check=False).returncode != 0


def test_a_claim_created_just_before_its_pod_is_found(
        k8s_cluster: Any, claims_ns: str, webhook: WebhookProcess) -> None:
    """Claim and pod in one `kubectl create` (created in that order, milliseconds apart), five
    times: every pod is admitted with its claim's resources."""
    names = [f"quick-{i}" for i in range(5)]
    manifests = "---\n".join(part for n in names
                             for part in (seed_claim(f"{n}-claim"), seed_pod(n, f"{n}-claim")))
    result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", input=manifests,
                                 check=False)
    assert result.returncode == 0, result.stderr
    for name in names:
        assert stored_resources(k8s_cluster, claims_ns, name) == {"limits": SHARE,
                                                                  "requests": SHARE}


def test_a_claim_container_with_its_own_gpu_is_refused(k8s_cluster: Any, claims_ns: str) -> None:
    k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", input=seed_claim("own-gpu-claim"))
    pod = json.loads(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "own-gpu", "annotations": {"egpuc.elasticgpu.io/main": "own-gpu-claim"}},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", input=json.dumps(pod),
                                 check=False)
    assert result.returncode != 0
    assert "gets its GPUs from ElasticGPUClaim own-gpu-claim" in result.stderr
    assert "(rule claim-container-gpu)" in result.stderr


def test_a_pod_naming_a_claim_being_deleted_is_refused(k8s_cluster: Any, claims_ns: str) -> None:
    """A claim held by a finalizer (as the controller's claim-protection holds one in use) and
    deleted: a new pod naming it is refused, saying so."""
    claim = seed_claim("leaving").replace("metadata:\n  name: leaving\n",
                                          "metadata:\n  name: leaving\n  finalizers: [test/hold]\n")
    k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", input=claim)
    k8s_cluster.kubectl("delete", "egpuc", "leaving", "-n", claims_ns, "--wait=false")
    try:
        deadline = time.monotonic() + 10
        while True:
            result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-",
                                         input=seed_pod("late", "leaving"), check=False)
            if result.returncode != 0 or time.monotonic() > deadline:
                break
            k8s_cluster.kubectl("delete", "pod", "late", "-n", claims_ns, "--wait=false")
            time.sleep(0.2)  # the watch has not delivered the deletion yet
        assert result.returncode != 0
        assert (f"ElasticGPUClaim leaving in namespace {claims_ns} is being deleted "
                "(rule claim-deleting)") in result.stderr
    finally:
        k8s_cluster.kubectl("patch", "egpuc", "leaving", "-n", claims_ns, "--type=json",
                            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
                            check=False)


def _pod_with_init(name: str, claim: str, named: str, restart: str | None) -> str:
    init: dict[str, Any] = {"name": "helper", "image": "busybox"}
    if restart is not None:
        init["restartPolicy"] = restart
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {f"egpuc.elasticgpu.io/{named}": claim}},
        "spec": {"initContainers": [init],
                 "containers": [{"name": "main", "image": "busybox"}]}})


def test_a_sidecar_naming_a_claim_is_stored_with_its_resources_and_an_init_container_refused(
        k8s_cluster: Any, claims_ns: str) -> None:
    """A sidecar (restartPolicy Always) runs for the pod's life and may use a claim: the real
    kube-apiserver stores the pod with the claim's resources in the sidecar (the webhook's
    patch under /spec/initContainers); a classic init container naming one is refused."""
    k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", input=seed_claim("sidecar-claim"))
    result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", check=False,
                                 input=_pod_with_init("with-sidecar", "sidecar-claim", "helper",
                                                      "Always"))
    assert result.returncode == 0, result.stderr
    obj = json.loads(k8s_cluster.kubectl("get", "pod", "with-sidecar", "-n", claims_ns, "-o",
                                         "json").stdout)
    limits = obj["spec"]["initContainers"][0]["resources"]["limits"]
    assert {k: limits[k] for k in SHARE} == SHARE
    assert not (obj["spec"]["containers"][0].get("resources") or {}).get("limits", {}).get(
        "elasticgpu.io/gpu-core")

    result = k8s_cluster.kubectl("create", "-n", claims_ns, "-f", "-", check=False,
                                 input=_pod_with_init("with-init", "sidecar-claim", "helper",
                                                      None))
    assert result.returncode != 0
    assert ("helper is an init container that runs to completion before the pod's containers "
            "start") in result.stderr and "(rule claim-annotation)" in result.stderr
