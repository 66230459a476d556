"""`egpu webhook` registered on the real kube-apiserver (issue #14's must-shows 1, 2 and 4).

The module's webhook is sent only namespaces labelled for it (the control plane is shared by the
whole test run); the fail-closed test registers one with the real scope (every namespace but
kube-system and its own) and removes it again.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import wait_bound, wait_extender_knows
from egpu_testing.webhook import (
    WebhookProcess,
    cleanup_webhook,
    running_webhook,
    wait_in_force,
)
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

LABEL = "egpu-webhook-test"


def pod_json(name: str, limits: dict[str, Any], *, scheduler: str | None = None,
             labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> str:
    """A pod as a user writes it (values as given: YAML numbers arrive as JSON numbers)."""
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


@pytest.fixture(scope="module")
def webhook(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[WebhookProcess]:
    with running_webhook(k8s_cluster, tmp_path_factory.mktemp("webhook"), "egpu-webhook",
                         LABEL) as hook:
        yield hook


@pytest.fixture
def gpu_ns(k8s_cluster: Any, k8s_namespace: str, webhook: WebhookProcess) -> str:
    k8s_cluster.kubectl("label", "namespace", k8s_namespace, f"{LABEL}={webhook.name}")
    wait_in_force(k8s_cluster, k8s_namespace)
    return k8s_namespace


@pytest.fixture
def eight_card_node(fake_gpu_nodes: Callable[..., list[str]], webhook: WebhookProcess
                    ) -> list[str]:
    nodes = fake_gpu_nodes(1, gpus=8)
    deadline = time.monotonic() + 30
    while webhook.metric("elasticgpu_webhook_largest_node_cards") != 8:
        assert time.monotonic() < deadline, "the webhook never saw the 8-card node"
        time.sleep(0.1)
    return nodes


# --- must-show 1 --------------------------------------------------------------------------

def test_gpusharing_seed_pod_is_admitted_mutated_and_scheduled(
        k8s_cluster: Any, gpu_ns: str, eight_card_node: list[str], tmp_path: Path,
        start_kube_scheduler: Callable[..., Any]) -> None:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    extender.start()
    try:
        scheduler = extender.scheduler_name
        start_kube_scheduler(extender_kube_scheduler_config(extender.url, scheduler))
        wait_extender_knows(extender.url, eight_card_node, 8)
        seed = pod_json("seed", {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 15},
                        scheduler=scheduler)
        result = k8s_cluster.kubectl("create", "-n", gpu_ns, "-f", "-", input=seed, check=False)
        assert result.returncode == 0, result.stderr
        pods = wait_bound(k8s_cluster.client(), gpu_ns, ["seed"])
        pod = pods["seed"]
        assert pod["spec"]["nodeName"] == eight_card_node[0]
        assert pod["metadata"]["annotations"]["tencent.com/vcuda-core-limit"] == "50"
        assert "elasticgpu.io/assignment" in pod["metadata"]["annotations"]
    finally:
        extender.stop()


def test_a_gpu_sidecar_is_admitted_and_bound_with_its_own_cards_a_classic_init_refused(
        k8s_cluster: Any, gpu_ns: str, eight_card_node: list[str], tmp_path: Path,
        start_kube_scheduler: Callable[..., Any]) -> None:
    """A sidecar (KEP-753: an init container with restartPolicy: Always) runs for the pod's
    life: its GPU share is admitted and placed like a container's. A classic init container's
    devices go to the pod's later containers once it ends: refused, with the reason."""
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.core.assignment import Assignment

    def with_init(name: str, restart_policy: str | None) -> str:
        pod = json.loads(pod_json(name, {"elasticgpu.io/gpu-core": 60}, scheduler=scheduler))
        init: dict[str, Any] = {"name": "proxy", "image": "busybox",
                                "resources": {"limits": {"elasticgpu.io/gpu-core": 60}}}
        if restart_policy:
            init["restartPolicy"] = restart_policy
        pod["spec"]["initContainers"] = [init]
        return json.dumps(pod)

    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    extender.start()
    try:
        scheduler = extender.scheduler_name
        start_kube_scheduler(extender_kube_scheduler_config(extender.url, scheduler))
        wait_extender_knows(extender.url, eight_card_node, 8)
        refused = k8s_cluster.kubectl("create", "-n", gpu_ns, "-f", "-",
                                      input=with_init("classic", None), check=False)
        assert refused.returncode != 0
        assert "init container proxy: elasticgpu.io/gpu-core: GPUs are given to regular " \
               "containers and sidecars" in refused.stderr, refused.stderr
        created = k8s_cluster.kubectl("create", "-n", gpu_ns, "-f", "-",
                                      input=with_init("sidecar", "Always"), check=False)
        assert created.returncode == 0, created.stderr
        pod = wait_bound(k8s_cluster.client(), gpu_ns, ["sidecar"])["sidecar"]
        assignment = Assignment.from_json(pod["metadata"]["annotations"]["elasticgpu.io/assignment"])
        (proxy,), (main,) = assignment.containers["proxy"], assignment.containers["main"]
        # two 60% shares: a card each
        assert (proxy.milli, main.milli) == (600, 600) and proxy.index != main.index
        assert pod["spec"]["initContainers"][0]["resources"]["limits"][
            "node.elasticgpu.io/gpu-core"] == "60"
    finally:
        extender.stop()


REFUSED = [
    ("vcuda-core-150", {"tencent.com/vcuda-core": 150},
     "tencent.com/vcuda-core='150': an integer 1-99 (a share of one card) or a multiple of 100"),
    ("vcuda-core-0", {"tencent.com/vcuda-core": 0},
     "tencent.com/vcuda-core='0': an integer 1-99 (a share of one card) or a multiple of 100"),
    ("vcuda-core-minus-5", {"tencent.com/vcuda-core": -5},
     "tencent.com/vcuda-core='-5': an integer 1-99"),
    # kube-apiserver writes 1.5 in its canonical form, 1500m, before any webhook sees it
    ("vcuda-core-1.5", {"tencent.com/vcuda-core": 1.5},
     "tencent.com/vcuda-core='1500m': an integer 1-99"),
    ("vcuda-memory-1Gi", {"tencent.com/vcuda-memory": "1Gi"},
     "tencent.com/vcuda-memory='1Gi': a non-negative whole number, counted in units of 256 MiB"),
    ("mig-name", {"nvidia.com/mig-3g.abc": 1},
     "nvidia.com/mig-3g.abc: a MIG profile is written <slices>g.<memory>gb"),
    ("nine-cards", {"nvidia.com/gpu": 9},
     "nvidia.com/gpu=9 cards: no node could ever hold it: the largest node"),
    # issue 40: a share on N cards needs a node of N cards
    ("nine-shares", {"elasticgpu.io/gpu": 9, "elasticgpu.io/gpu-core": 30},
     "=9 shares: a share on each of 9 distinct cards of one node; no node could ever hold it: "
     "the largest node"),
    ("tflops-0", {"elasticgpu.io/gpu-tflops": 0},
     "elasticgpu.io/gpu-tflops='0': a positive whole number"),
    ("tflops-1.5", {"elasticgpu.io/gpu-tflops": 1.5},
     "elasticgpu.io/gpu-tflops='1500m': a positive whole number"),
    ("tflops-and-percent", {"elasticgpu.io/gpu-tflops": 10, "elasticgpu.io/gpu-core": 20},
     "ask for compute in TFLOPS, in percent or in whole cards, one of them"),
]


@pytest.mark.parametrize(("case", "limits", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_each_rule_refuses_at_kubectl_create_with_its_message(
        k8s_cluster: Any, gpu_ns: str, eight_card_node: list[str], case: str,
        limits: dict[str, Any], words: str) -> None:
    result = k8s_cluster.kubectl("create", "-n", gpu_ns, "-f", "-",
                                 input=pod_json("bad", limits), check=False)
    assert result.returncode != 0
    stderr = result.stderr
    assert 'admission webhook "pods.mutate.elasticgpu.io" denied the request' in stderr, stderr
    assert "container main: " in stderr and words in stderr, stderr
    if case in ("nine-cards", "nine-shares"):
        assert f"the largest node, {eight_card_node[0]}, has 8 cards" in stderr
    pods = k8s_cluster.kubectl("get", "pods", "-n", gpu_ns, "-o", "name").stdout
    assert "pod/bad" not in pods


def test_a_share_on_two_cards_is_admitted_and_stored_as_shares(
        k8s_cluster: Any, gpu_ns: str, eight_card_node: list[str]) -> None:
    """Issue 40: `elasticgpu.io/gpu: 2` beside a share is 2 shares on 2 cards; the webhook
    keeps the count (it does not become 2 whole cards) and counts 2 x the share for
    kube-scheduler's node-level figure."""
    limits = {"elasticgpu.io/gpu": 2, "elasticgpu.io/gpu-core": 30,
              "elasticgpu.io/gpu-memory": 8192}
    result = k8s_cluster.kubectl("create", "-n", gpu_ns, "-f", "-",
                                 input=pod_json("two-shares", limits), check=False)
    assert result.returncode == 0, result.stderr
    stored = json.loads(k8s_cluster.kubectl("get", "pod", "two-shares", "-n", gpu_ns,
                                            "-o", "json").stdout)
    kept = stored["spec"]["containers"][0]["resources"]["limits"]
    assert (kept["elasticgpu.io/gpu"], kept["elasticgpu.io/gpu-core"]) == ("2", "30")
    assert kept["node.elasticgpu.io/gpu-core"] == "60"


def test_non_gpu_pods_are_not_sent(k8s_cluster: Any, gpu_ns: str,
                                   webhook: WebhookProcess) -> None:
    before = webhook.metric("elasticgpu_webhook_requests_total")
    result = k8s_cluster.kubectl("create", "-n", gpu_ns, "-f", "-",
                                 input=pod_json("cpu-only", {"cpu": "1"}), check=False)
    assert result.returncode == 0, result.stderr
    assert webhook.metric("elasticgpu_webhook_requests_total") == before


# --- must-show 2 --------------------------------------------------------------------------

def test_webhook_down_gpu_pods_fail_closed_others_unaffected(
        k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> None:
    name = unique_name("egpu-webhook-down")
    (port,) = free_ports(1)
    # The real scope: every namespace but kube-system and the webhook's own.
    hook = WebhookProcess(k8s_cluster.kubeconfig, port, tmp_path / "webhook.log", name=name,
                          namespace=name)
    hook.start()
    created: list[tuple[str, str]] = []
    try:
        wait_in_force(k8s_cluster, k8s_namespace)
        hook.kill()
        gpu = pod_json("gpu", {"nvidia.com/gpu": 1})
        result = k8s_cluster.kubectl("create", "-n", k8s_namespace, "-f", "-", input=gpu,
                                     check=False)
        assert result.returncode != 0
        assert 'failed calling webhook "pods.mutate.elasticgpu.io"' in result.stderr, \
            result.stderr
        for namespace, pod_name, manifest in (
                (k8s_namespace, "cpu", pod_json("cpu", {"cpu": "100m"})),
                ("kube-system", unique_name("gpu"), gpu),
                (name, "gpu", gpu),
                (k8s_namespace, "opted-out", pod_json("opted-out", {"nvidia.com/gpu": 1},
                                                      labels={"elasticgpu.io/admission":
                                                              "ignore"}))):
            body = json.loads(manifest)
            body["metadata"]["name"] = pod_name
            result = k8s_cluster.kubectl("create", "-n", namespace, "-f", "-",
                                         input=json.dumps(body), check=False)
            assert result.returncode == 0, (namespace, pod_name, result.stderr)
            created.append((namespace, pod_name))
    finally:
        for namespace, pod_name in created:
            k8s_cluster.kubectl("delete", "pod", "-n", namespace, pod_name, "--grace-period=0",
                                "--force", "--wait=false", check=False)
        cleanup_webhook(k8s_cluster, hook)


# --- must-show 4 --------------------------------------------------------------------------

def review(obj: Any, uid: str = "u1", **request: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": "ns", "object": obj, **request}}


#: The fuzz corpus's hostile part (issue 26, item 8): 100,000 levels of lists or objects, as
#: the body, as the pod, and deep inside a field admission ignores.
DEEP_BODIES = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    json.dumps(review({"metadata": {}, "spec": "DEEP"})).encode().replace(
        b'"DEEP"', b"[" * 100_000 + b"]" * 100_000),
    json.dumps(review({"metadata": {"annotations": {"a": "DEEP"}}})).encode().replace(
        b'"DEEP"', b'{"x":' * 100_000 + b"1" + b"}" * 100_000),
]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4), max_leaves=20)
RESOURCES = st.dictionaries(
    st.sampled_from(["tencent.com/vcuda-core", "tencent.com/vcuda-memory", "nvidia.com/gpu",
                     "nvidia.com/mig-1g.10gb", "nvidia.com/mig-x", "elasticgpu.io/gpu-memory",
                     "cpu", "memory"]), JSON | st.text(max_size=6), max_size=4)
PODS = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({}, optional={"annotations": JSON | st.dictionaries(
        st.sampled_from(["elasticgpu.io/node-policy", "elasticgpu.io/gpu-model",
                         "tencent.com/vcuda-core-limit"]), st.text(max_size=6))}),
    "spec": st.fixed_dictionaries({}, optional={
        "containers": st.lists(st.fixed_dictionaries({"name": JSON}, optional={
            "resources": st.fixed_dictionaries({}, optional={"limits": RESOURCES,
                                                             "requests": RESOURCES}) | JSON}),
            max_size=3) | JSON,
        "initContainers": JSON})}) | JSON
BODIES = (st.builds(lambda pod: json.dumps(review(pod)).encode(), PODS)
          | st.builds(lambda top: json.dumps(top).encode(), JSON)
          | st.builds(lambda r: json.dumps({"apiVersion": "admission.k8s.io/v1",
                                            "kind": "AdmissionReview", "request": r}).encode(),
                      JSON)
          | st.binary(max_size=64)
          | st.sampled_from(DEEP_BODIES))


def test_fuzzed_reviews_never_get_a_5xx(webhook: WebhookProcess) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=BODIES, path=st.sampled_from(["/mutate", "/validate"]))
    def one(body: bytes, path: str) -> None:
        status, answer = webhook.post(path, body)
        assert 200 <= status < 500, (status, answer, body[:200])
        if status == 200:
            response = answer["response"]
            assert response["uid"] and isinstance(response["allowed"], bool)
            if not response["allowed"]:
                message = response["status"]["message"]
                assert message and "webhook error" not in message  # a rule, not a caught bug
            seen["allowed" if response["allowed"] else "refused"] += 1
        else:
            assert status == 400 and answer["error"]
            seen["bad_request"] += 1

    one()
    # the bodies reached every path: 400s, refusals naming a rule, and allowed pods
    assert seen["bad_request"] > 50 and seen["refused"] > 50 and seen["allowed"] > 5, seen


def test_oversized_body_gets_413(webhook: WebhookProcess) -> None:
    status, _ = webhook.post("/validate", b"{" + b" " * (5 * 2**20) + b"}")
    assert status == 413


# --- issue 26: hostile bodies, names and connections ---------------------------------------

@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_deep_nesting_gets_a_400_naming_the_limit(webhook: WebhookProcess, path: str) -> None:
    for body in DEEP_BODIES:
        status, answer = webhook.post(path, body)
        assert status == 400, (status, answer)
        assert "levels deep, more than the limit of 256" in answer["error"], answer
    assert webhook.ready()


def test_a_namespace_that_is_a_path_is_refused_without_a_lookup(webhook: WebhookProcess
                                                                ) -> None:
    """Issue 26, item 10: the review's namespace went into the claim read's path as it was:
    `../../../../api/v1/nodes/x#` made the webhook GET a Node with its own rights. The pod
    names a claim (a live read on a cache miss), so without the check the read is made."""
    hostile = "../../../../api/v1/nodes/x#"
    pod = json.loads(pod_json("p", {}, annotations={"egpuc.elasticgpu.io/main": "c1"}))
    reads = webhook.metric("elasticgpu_webhook_claim_lookups_total", 'source="api"')
    for path in ("/mutate", "/validate"):
        status, answer = webhook.post(path, json.dumps(review(pod, namespace=hostile)).encode())
        assert status == 400, (status, answer)
        assert f"request.namespace {hostile!r}" in answer["error"]
        assert "DNS-1123 label" in answer["error"]
    # no live read was made: none reached the API, let alone the Node
    assert webhook.metric("elasticgpu_webhook_claim_lookups_total", 'source="api"') == reads
    # the same review in a real namespace is judged, with its live read
    status, answer = webhook.post("/validate", json.dumps(review(pod, namespace="ns")).encode())
    assert status == 200 and not answer["response"]["allowed"]
    assert "c1" in answer["response"]["status"]["message"]


def test_a_flood_of_idle_connections_is_bounded_and_closed(k8s_cluster: Any,
                                                          tmp_path: Path) -> None:
    """Issue 26, item 9: 1,200 idle TLS connections stayed open 60 s, and at the fd limit new
    connections were reset. With small bounds (flags): a flood beyond the cap leaves the
    webhook answering at once, and the webhook closes every idle connection."""
    from egpu_testing.flood import close_all, closed_by_server, idle_tcp, idle_tls, wait_until
    from egpu_testing.webhook import insecure_context

    cap = 40
    with running_webhook(k8s_cluster, tmp_path, "egpu-flood", LABEL, extra_args=[
            "--header-timeout-seconds", "3", "--idle-timeout-seconds", "3",
            "--max-connections", str(cap)]) as hook:
        flood = idle_tls(hook.port, insecure_context(), 2 * cap)
        bare = idle_tcp(hook.port, cap)
        try:
            assert hook.ready()  # a real request, at once, while the flood is open
            status, answer = hook.post("/validate", DEEP_BODIES[0])
            assert status == 400 and "levels deep" in answer["error"]
            wait_until(lambda: all(closed_by_server(s) for s in flood),
                       f"the webhook closes {len(flood)} idle TLS connections")
            wait_until(lambda: all(closed_by_server(s) for s in bare),
                       f"the webhook closes {len(bare)} connections that never started TLS")
            assert hook.ready()
        finally:
            close_all(flood)
            close_all(bare)
