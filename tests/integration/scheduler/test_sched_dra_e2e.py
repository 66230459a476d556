"""Issue 31, the cluster side: Elastic GPU as the DRA driver `gpu.elasticgpu.io` on kwok nodes.

One `egpu sandbox up --cluster FILE` (the whole system: kube-scheduler calling our extender,
the webhook, the controller, allocation-sync standing in for the nodes' agents) with a
device-plugin node beside three DRA-mode nodes, whose ResourceSlices allocation-sync
published from their fake inventory. Through the manifests of docs/examples/dra/ (the ones
docs/dra.md shows):

(a) a pod with a ResourceClaimTemplate for a whole card; (b) two pods sharing the one card of
a single-card DRA node through consumable capacity, and a third that asks more than is left
gets no device; (c) a MIG partition by profile; (d) a plain `nvidia.com/gpu: 1` pod served
through the extended-resource mapping on a DRA node (kube-scheduler's special claim), while
device-plugin pods run on the other node; (e) the independent ledger check over claims and
assignments finds no card over capacity. Then the hostile cases (compute 150, memory above
the card, a tenant writing ResourceSlices) and the native ResourceQuota on our class.
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing import sandbox as cli
from egpu_testing.defrag_sandbox import over_allocated
from egpu_testing.dra_ledger import claim_card_use, dra_inventories, over_capacity
from elastic_gpu.api import gpudevice
from elastic_gpu.core.dra.nodemode import is_dra_node
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.nodes import load_cluster

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples" / "dra"
CLUSTER_FILE = """\
nodeGroups:
- name: dp          # device plugin: GPUDevices, the extender places the cards
  count: 1
  gpus: 2
- name: share       # one card: the shares below must meet on it
  count: 1
  gpus: 1
  gpuMode: dra
- name: dra
  count: 1
  gpus: 2
  gpuMode: dra
- name: mig
  count: 1
  gpus: 1
  gpuMode: dra
  mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]
"""
egpu = functools.partial(cli.egpu, timeout=300)


class Box:
    def __init__(self, state: Path, kubeconfig: Path, inventories: list[Node]) -> None:
        self.state = state
        self.kc = kubeconfig
        self.inventories = inventories

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return cli.kubectl(self.kc, *args, input=input)

    def run(self, *args: str, input: str | None = None) -> Any:
        return cli.kubectl_run(self.kc, *args, input=input)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, namespace: str, docs: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-",
                     input=yaml.safe_dump_all(docs))

    def namespace(self, name: str) -> str:
        self.kubectl("create", "namespace", name)
        return name

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.get("pod", "-n", namespace, name))

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.5)

    def running(self, namespace: str, name: str) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            return pod if (pod.get("status") or {}).get("phase") == "Running" else None
        return dict(self.wait(f"pod {namespace}/{name} Running", ready))

    def extender_binds(self) -> float:
        """Pods the extender's bind verb has bound (its /metrics)."""
        state = json.loads((self.state / "state.json").read_text())
        url = state["components"]["egpu-scheduler"]["endpoint"] + "/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith("elasticgpu_scheduler_requests_total{") and \
                    'verb="bind"' in line and 'outcome="bound"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def claim_of(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The (first) ResourceClaim the pod's status names, with its allocation."""
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        name = statuses[0]["resourceClaimName"]
        return dict(self.get("resourceclaim", "-n", pod["metadata"]["namespace"], name))

    def unschedulable_message(self, namespace: str, name: str, containing: str = "") -> str:
        """The pod's PodScheduled=False message, once it contains `containing`: a pod our
        allocator hands to kube-scheduler is first reported gated, then kube-scheduler's reason."""
        def message() -> str | None:
            pod = self.pod(namespace, name)
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                        and containing in str(cond.get("message") or "") and cond.get("message"):
                    return str(cond["message"])
            return None
        return str(self.wait(f"pod {namespace}/{name} reported unschedulable", message))


def examples(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def renamed(docs: list[dict[str, Any]], suffix: str, *, node: str | None = None,
            capacity: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The example's template and pod under `<name>-<suffix>` (the pod naming its template),
    pinned to `node`, the template asking `capacity` instead."""
    out = json.loads(json.dumps(docs))
    template = next(d for d in out if d["kind"] == "ResourceClaimTemplate")
    pod = next(d for d in out if d["kind"] == "Pod")
    template["metadata"]["name"] += f"-{suffix}"
    pod["metadata"]["name"] += f"-{suffix}"
    for ref in pod["spec"]["resourceClaims"]:
        ref["resourceClaimTemplateName"] = template["metadata"]["name"]
    if node is not None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if capacity is not None:
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
            "requests": capacity}
    return out


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                .get("results") or [])


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    tmp = tmp_path_factory.mktemp("dra")
    (tmp / "cluster.yaml").write_text(CLUSTER_FILE)
    state = tmp / "state"
    up = egpu("sandbox", "up", "--cluster", str(tmp / "cluster.yaml"), "--state-dir",
              str(state), "--timeout", "180")
    assert up.returncode == 0, up.stderr + up.stdout
    inventories = [inv for g in load_cluster(tmp / "cluster.yaml") for inv in g.inventories()]
    try:
        yield Box(state, state / "kubeconfig", inventories)
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr


def test_the_dra_features_are_on_without_any_flag(box: Box) -> None:
    """kube 1.36: resource.k8s.io/v1 served, and the beta gates this driver needs on by
    default (the sandbox passes no --feature-gates)."""
    assert "resource.k8s.io/v1" in box.kubectl("api-versions").split()
    metrics = box.kubectl("get", "--raw", "/metrics")
    for gate in ("DynamicResourceAllocation", "DRAConsumableCapacity", "DRAPartitionableDevices",
                 "DRAExtendedResource", "DRADeviceTaints"):
        assert f'kubernetes_feature_enabled{{name="{gate}",stage="' in metrics, gate
        line = next(x for x in metrics.splitlines()
                    if x.startswith(f'kubernetes_feature_enabled{{name="{gate}",'))
        assert line.endswith(" 1"), line
    # kube-controller-manager (--controllers=*,...) names each controller it skips or has
    # disabled; the resourceclaim controller (templates -> claims) is not among them, and the
    # claims made from templates below are its work
    cm = (box.state / "cluster" / "logs" / "kube-controller-manager.log").read_text()
    assert 'controller="resourcepoolstatusrequest-controller"' in cm  # the log does name them
    for controller in ("resourceclaim-controller", "device-taint-eviction-controller"):
        off = [line for line in cm.splitlines() if f'controller="{controller}"' in line
               and ("skipping" in line or "disabled" in line)]
        assert off == [], off


def test_dra_nodes_publish_slices_and_no_gpudevices(box: Box) -> None:
    slices = box.get("resourceslices")["items"]
    devices = sorted(d["name"] for s in slices for d in (s["spec"].get("devices") or []))
    by_pool = {}
    for s in slices:
        by_pool.setdefault(s["spec"]["pool"]["name"], []).append(s)
    assert sorted(by_pool) == ["dra-000", "mig-000", "share-000"]
    assert len(by_pool["mig-000"]) == 2  # devices, and the card's counter set
    # placed by NVIDIA's rules: 2g.20gb@0, 1g.10gb@2, 1g.10gb@3, 3g.40gb@4
    assert "gpu-0-mig-3-1g-10gb" in devices and devices.count("gpu-0") == 2
    gpudevices = box.get("gpudevices")["items"]
    assert {d["metadata"]["labels"][gpudevice.NODE_LABEL] for d in gpudevices} == {"dp-000"}
    node = box.get("node", "dra-000")
    assert node["metadata"]["labels"]["elasticgpu.io/gpu-mode"] == "dra"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert node["status"]["allocatable"]["node.elasticgpu.io/gpu-core"] == "200"
    classes = {c["metadata"]["name"]: c for c in box.get("deviceclasses")["items"]}
    assert classes["gpu.elasticgpu.io"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "mig.gpu.elasticgpu.io" in classes


def test_claims_whole_share_mig_and_nvidia_gpu_beside_device_plugin_pods(box: Box) -> None:
    ns = box.namespace("dra-main")
    # device-plugin pods at the same time, on the other node, placed by the extender
    dp = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"dp-{i}"},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": "dp-000"},
                    "containers": [{"name": "main", "image": "cuda:fake", "resources": {
                        "limits": limits}}]}}
          for i, limits in enumerate([{"elasticgpu.io/gpu-core": "50"},
                                      {"elasticgpu.io/gpu-core": "50"},
                                      {"nvidia.com/gpu": "1"}])]
    box.apply(ns, dp)
    # (a) a whole card, on the two-card DRA node
    box.apply(ns, renamed(examples("whole.yaml"), "a", node="dra-000"))
    # (b) two halves of the single card of share-000
    share = examples("share.yaml")
    box.apply(ns, renamed(share, "1", node="share-000") + renamed(share, "2", node="share-000"))
    # (c) a MIG instance by profile
    box.apply(ns, examples("mig.yaml"))
    # (d) nvidia.com/gpu, on DRA nodes only (the example's nodeSelector)
    box.apply(ns, examples("nvidia-gpu.yaml"))

    whole = box.running(ns, "whole-a")
    [result] = results(box.claim_of(whole))
    assert (result["driver"], result["pool"], whole["spec"]["nodeName"]) == (
        "gpu.elasticgpu.io", "dra-000", "dra-000")

    halves = [box.running(ns, f"half-{i}") for i in (1, 2)]
    claims = [box.claim_of(p) for p in halves]
    got = [results(c) for c in claims]
    assert [[(r["pool"], r["device"]) for r in rs] for rs in got] == [[("share-000", "gpu-0")]] * 2
    assert all(r[0].get("shareID") for r in got) and got[0][0]["shareID"] != got[1][0]["shareID"]
    assert [r[0]["consumedCapacity"] for r in got] == [{"compute": "50", "memory": "4Gi"}] * 2
    use, problems = claim_card_use(claims, box.inventories)
    assert problems == []
    assert (use[("share-000", 0)].milli, use[("share-000", 0)].memory_mib) == (1000, 8192)
    # a third asking more than is left (60 of the card's 100 % are taken by 100): no device;
    # our allocator keeps it gated until room frees (docs/dra.md, "Claims placed by our engine")
    box.apply(ns, renamed(share, "3", node="share-000", capacity={"compute": "60",
                                                                   "memory": "4Gi"}))
    time.sleep(3)
    third = box.pod(ns, "half-3")
    assert not third["spec"].get("nodeName")
    assert third["spec"].get("schedulingGates") == [{"name": "elasticgpu.io/dra-placement"}]
    assert not results(box.claim_of(third))

    mig = box.running(ns, "mig")
    [result] = results(box.claim_of(mig))
    assert result["pool"] == "mig-000" and result["device"].endswith("-1g-10gb")

    plain = box.running(ns, "plain-gpu")
    assert plain["spec"]["nodeName"] == "dra-000"  # its other card; mig-000 has no whole one
    status = plain["status"].get("extendedResourceClaimStatus") or {}
    assert status.get("resourceClaimName"), plain["status"]
    special = box.get("resourceclaim", "-n", ns, status["resourceClaimName"])
    [result] = results(special)
    assert (result["pool"], result["device"]) != ("dra-000", results(box.claim_of(whole))[0]
                                                  ["device"])
    # bound by our extender's bind verb: a Binding without any card assignment
    assert "elasticgpu.io/assignment" not in (plain["metadata"].get("annotations") or {})

    for i in range(3):
        pod = box.running(ns, f"dp-{i}")
        assert "elasticgpu.io/assignment" in pod["metadata"]["annotations"]
    # the three device-plugin pods and plain-gpu went through our bind verb, and so did the
    # four claim pods placed (whole-a, half-1, half-2, mig): the webhook puts the quota's
    # accounting names, managed resources, on them (docs/dra.md, "One quota, one budget")
    assert box.extender_binds() == 8




def _ledger_nodes(box: Box) -> list[Node]:
    dp = gpudevice.nodes_from_objects(box.get("gpudevices")["items"])
    return dp + [inv for inv in box.inventories
                 if is_dra_node(inv.labels)]


def test_the_ledger_finds_no_card_over_capacity_across_both_paths(box: Box) -> None:
    pods = box.get("pods", "-A")["items"]
    claims = box.get("resourceclaims", "-A")["items"]
    nodes = _ledger_nodes(box)
    assert over_capacity(pods, claims, nodes) == []
    # the same check as the defragmentation sandboxes run it, all from the API (device-plugin
    # cards from GPUDevices, DRA cards from the inventory each DRA node carries)
    assert sorted(dra_inventories(box.get("nodes")["items"]), key=lambda n: n.name) == sorted(
        (replace(inv, cpu_milli=0, memory_mib=0, labels={}) for inv in box.inventories
         if is_dra_node(inv.labels)), key=lambda n: n.name)
    assert over_allocated(box.kc) == []
    # and it would see one: a claim's allocation copied to a second claim on a whole card
    whole = next(c for c in claims if results(c) and results(c)[0]["pool"] == "dra-000")
    forged = json.loads(json.dumps(whole))
    forged["metadata"]["name"] += "-forged"
    problems = over_capacity(pods, [*claims, forged], nodes)
    assert problems and "dra-000 card" in problems[0], problems


@pytest.mark.parametrize("capacity", [{"compute": "150", "memory": "4Gi"},
                                      {"compute": "10", "memory": "100Gi"}])
def test_a_claim_asking_more_than_a_card_gets_no_allocation(box: Box,
                                                            capacity: dict[str, str]) -> None:
    ns = box.namespace(f"dra-big-{capacity['compute']}")
    docs = renamed(examples("share.yaml"), "big", capacity=capacity)
    # kube-apiserver takes the claim (capacity requests are checked when allocating) ...
    box.apply(ns, docs)
    # ... and kube-scheduler's allocator finds no device with that much left, on any node
    # (our allocator reports it gated first, then hands it over)
    message = box.unschedulable_message(ns, "half-big", "cannot allocate all claims")
    assert "cannot allocate all claims" in message, message
    claims = box.get("resourceclaims", "-n", ns)["items"]
    assert claims and all(not results(c) for c in claims)


def test_a_tenant_with_edit_cannot_write_resource_slices(box: Box) -> None:
    ns = box.namespace("dra-tenant")
    box.kubectl("create", "rolebinding", "tenant-edit", "-n", ns, "--clusterrole=edit",
                "--user=dra-tenant")
    forged = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"name": "forged"},
              "spec": {"driver": "gpu.elasticgpu.io", "nodeName": "dra-000",
                       "pool": {"name": "dra-000", "generation": 99, "resourceSliceCount": 1},
                       "devices": [{"name": "gpu-9"}]}}
    created = box.run("create", "--as=dra-tenant", "-v=6", "-f", "-", input=json.dumps(forged))
    assert created.returncode != 0 and "403" in created.stderr, created.stderr
    name = box.get("resourceslices")["items"][0]["metadata"]["name"]
    patched = box.run("patch", "resourceslice", name, "--as=dra-tenant", "-v=6", "--type=merge",
                      "-p", '{"metadata": {"labels": {"mine": "yes"}}}')
    assert patched.returncode != 0 and "403" in patched.stderr, patched.stderr
    # what edit does give: claims in its namespace
    can = box.run("auth", "can-i", "create", "resourceclaims.resource.k8s.io", "-n", ns,
                  "--as=dra-tenant")
    assert can.stdout.strip() == "yes", can.stdout + can.stderr


def test_a_resource_quota_on_the_class_refuses_a_second_claim(box: Box) -> None:
    ns = box.namespace("dra-quota")
    box.apply(ns, examples("quota.yaml"))
    key = "gpu.elasticgpu.io.deviceclass.resource.k8s.io/devices"
    box.wait("the quota's status", lambda: (box.get("resourcequota", "-n", ns, "gpu-devices")
                                            .get("status") or {}).get("hard", {}).get(key))
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "first"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu.elasticgpu.io"}}]}}}
    box.apply(ns, [claim])
    second = json.loads(json.dumps(claim))
    second["metadata"]["name"] = "second"
    refused = box.run("create", "-n", ns, "-f", "-", input=json.dumps(second))
    assert refused.returncode != 0, refused.stdout
    assert "exceeded quota" in refused.stderr and key in refused.stderr, refused.stderr


def test_a_share_by_resource_name_is_refused_on_dra_nodes_by_the_extender(box: Box) -> None:
    ns = box.namespace("dra-frac")
    box.apply(ns, [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "frac"},
                    "spec": {"nodeSelector": {"elasticgpu.io/gpu-mode": "dra"},
                             "containers": [{"name": "main", "image": "cuda:fake",
                                             "resources": {"limits": {
                                                 "elasticgpu.io/gpu-core": "30"}}}]}}])
    message = box.unschedulable_message(ns, "frac")
    # one sentence for the three DRA nodes, so kube-scheduler counts it
    assert ("3 the node serves GPUs through DRA; ask for a share with a ResourceClaim "
            "of class gpu.elasticgpu.io") in message, message


def test_sandbox_up_dra_nodes_makes_the_last_nodes_dra_with_mig_on_the_first(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = egpu("sandbox", "up", "--gpu-nodes", "3", "--gpus-per-node", "2", "--dra-nodes", "2",
              "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        small = Box(state, state / "kubeconfig", [])
        modes = {n["metadata"]["name"]: n["metadata"]["labels"].get("elasticgpu.io/gpu-mode")
                 for n in small.get("nodes")["items"]}
        assert modes == {"gpu-node-000": None, "gpu-node-001": "dra", "gpu-node-002": "dra"}
        devices = {s["spec"]["pool"]["name"]: sorted(d["name"] for d in s["spec"]["devices"])
                   for s in small.get("resourceslices")["items"] if s["spec"].get("devices")}
        assert devices == {"gpu-node-001": ["gpu-0", "gpu-1-mig-0-2g-20gb", "gpu-1-mig-2-1g-10gb",
                                            "gpu-1-mig-3-1g-10gb", "gpu-1-mig-4-3g-40gb"],
                           "gpu-node-002": ["gpu-0", "gpu-1"]}
        small.apply("default", examples("share.yaml"))
        assert small.running("default", "half")["spec"]["nodeName"] in devices
        # a burst of 30 % shares at once over the three shareable cards (one already half
        # taken): 1 + 3 + 3 fit, our allocator gives no card more and keeps the rest gated
        burst = [doc for i in range(10) for doc in renamed(
            examples("share.yaml"), f"b{i}", capacity={"compute": "30", "memory": "1Gi"})]
        small.apply("default", burst)
        names = [f"half-b{i}" for i in range(10)]

        def settled() -> list[dict[str, Any]] | None:
            pods = [small.pod("default", n) for n in names]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            gated = [p for p in pods if p["spec"].get("schedulingGates")]
            return pods if len(running) == 7 and len(gated) == 3 else None
        small.wait("7 of the burst running, 3 gated", settled)
        claims = small.get("resourceclaims", "-A")["items"]
        nodes = dra_inventories(small.get("nodes")["items"])
        assert over_capacity(small.get("pods", "-A")["items"], claims, nodes) == []
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr


def test_a_quota_spelled_with_kubernetes_io_counts_nothing(box: Box) -> None:
    """The name docs/dra.md warns of: accepted, never counted (kube counts
    `<class>.deviceclass.resource.k8s.io/devices`)."""
    ns = box.namespace("dra-quota-miss")
    wrong = "gpu.elasticgpu.io.deviceclass.resource.kubernetes.io/devices"
    box.apply(ns, [{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "miss"},
                    "spec": {"hard": {wrong: "1"}}}])
    box.wait("the quota's status", lambda: (box.get("resourcequota", "-n", ns, "miss")
                                            .get("status") or {}).get("hard", {}).get(wrong))
    for name in ("one", "two"):
        box.apply(ns, [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name},
                        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                            "deviceClassName": "gpu.elasticgpu.io"}}]}}}])
    used = box.get("resourcequota", "-n", ns, "miss")["status"].get("used", {})
    assert used.get(wrong, "0") == "0", used
