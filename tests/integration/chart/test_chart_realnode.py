"""The chart's components as real pods on the dev cluster's real kubelet node (issue 18,
must-show 2, where the machine allows; skipped with the reason where it cannot run a real node).

No image can be pulled here, so the one Elastic GPU image is built on the machine
(`devcluster.egpu_image`: this interpreter, the package and its runtime requirements, their
libraries; kube-scheduler's image from the binary hack/ensure-k8s.sh built) and imported into
the node's containerd. `helm install` with values only (the local images, `pullPolicy: Never`,
the real node's label and taint, one replica each, free host ports, the agent's fake backend);
then what stands in for the cluster network the machine lacks (the kernel has no bridge or
veth routing for pods, there is no kube-proxy or DNS): each pod on the host network with
KUBERNETES_SERVICE_HOST/PORT set to the apiserver's loopback address, and the two clients of
the extender's Service (kube-scheduler's extender URL, the controller's --extender-url) given
127.0.0.1, which the chart's serving certificate names. Every Deployment and the DaemonSet
become available; an `nvidia.com/gpu` pod and an `elasticgpu.io/gpu-core` share pod are
scheduled by the chart's kube-scheduler and extender and get their cards from the agent's
Allocate through the real kubelet; `helm uninstall` stops the components' pods and leaves the
GPU pods' containers running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from egpu_testing.chart import CHART, Release
from egpu_testing.waiting import wait_for
from elastic_gpu.devcluster.egpu_image import binary_image, egpu_image
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.realnode import REAL_NODE_LABEL, REAL_NODE_TOLERATION

pytestmark = pytest.mark.integration

NVIDIA_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
INVENTORY = {"cards": [{"model": "A100-SXM4-80GB", "memoryMiB": 81920},
                       {"model": "A100-SXM4-80GB", "memoryMiB": 81920}]}
WORKLOADS = ("deployment/elastic-gpu-scheduler", "deployment/elastic-gpu-kube-scheduler",
             "deployment/elastic-gpu-webhook", "deployment/elastic-gpu-controller",
             "daemonset/elastic-gpu-agent")


def get(cluster: Any, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", *args, "-o", "json").stdout))


@pytest.fixture
def release(k8s_cluster: Any, real_node: Any, tmp_path: Path
            ) -> Iterator[tuple[Release, int]]:
    """The release on the real node, and the extender's (host) port."""
    for name, (_ref, archive) in (
            ("egpu", egpu_image("0.1.0")),
            ("kube-scheduler", binary_image("egpu.local/kube-scheduler:v1.36.3",
                                            (k8s_cluster.bin_dir / "kube-scheduler").resolve()))):
        tar = tmp_path / f"{name}.tar"
        tar.write_bytes(archive)
        real_node.import_image(tar)
        tar.unlink()
    k8s_cluster.kubectl("label", "node", real_node.name, "elasticgpu.io/agent=true",
                        "--overwrite")
    rel = Release(k8s_cluster, tmp_path / "helm")
    rel.clear_leftovers()
    ports = free_ports(4)
    here = {"nodeSelector": {REAL_NODE_LABEL: "true"}, "tolerations": [REAL_NODE_TOLERATION]}
    values = {
        "image": {"registry": "egpu.local", "repository": "elastic-gpu", "tag": "0.1.0",
                  "pullPolicy": "Never"},
        # one replica: on the one node's host network, two would want the same ports
        "scheduler": {**here, "replicas": 1, "port": ports[0], "healthPort": ports[3],
                      "kubeScheduler": {"image": {
            "registry": "egpu.local", "repository": "kube-scheduler", "tag": "v1.36.3",
            "pullPolicy": "Never"}}},
        "webhook": {**here, "replicas": 1, "port": ports[1],
                    # no namespace carries it: the apiserver cannot reach a pod (no network)
                    "namespaceLabels": {"egpu-chart-realnode": rel.namespace}},
        "controller": {**here, "replicas": 1, "metricsPort": ports[2]},
        "agent": {"tolerations": [NVIDIA_TOLERATION, REAL_NODE_TOLERATION],
                  "config": {"backend": "fake", "fake": {"inventory": "inventory.yaml"},
                             "migStrategy": "mixed"}},
    }
    rel.helm("install", "egpu", str(CHART), "--create-namespace",
             *(a for key, value in values.items()
               for a in ("--set-json", f"{key}={json.dumps(value)}")))
    yield rel, ports[0]
    rel.uninstall_quietly()
    k8s_cluster.kubectl("label", "node", real_node.name, "elasticgpu.io/agent-", check=False)


def _network_stand_in(cluster: Any, rel: Release, extender_port: int) -> None:
    """What a cluster network would give the pods: the apiserver and the extender's Service."""
    server = urlparse(cluster.server)
    ns = rel.namespace
    # the fake backend's inventory beside agent.yaml in the agent's ConfigMap
    cluster.kubectl("patch", "configmap", "elastic-gpu-agent", "-n", ns, "--type=merge", "-p",
                    json.dumps({"data": {"inventory.yaml": yaml.safe_dump(INVENTORY)}}))
    extender = f"https://127.0.0.1:{extender_port}"
    config = get(cluster, "configmap", "elastic-gpu-kube-scheduler", "-n", ns)
    text = config["data"]["config.yaml"]
    stanza = yaml.safe_load(text)["extenders"][0]["urlPrefix"]
    cluster.kubectl("patch", "configmap", "elastic-gpu-kube-scheduler", "-n", ns,
                    "--type=merge", "-p", json.dumps(
                        {"data": {"config.yaml": text.replace(stanza, extender)}}))
    # a flag given beats the config's extender.url (docs/config.md, "Precedence")
    cluster.kubectl("patch", "deployment", "elastic-gpu-controller", "-n", ns, "--type=json",
                    "-p", json.dumps([{"op": "add",
                                       "path": "/spec/template/spec/containers/0/command/-",
                                       "value": f"--extender-url={extender}"}]))
    for workload in WORKLOADS:
        obj = get(cluster, workload, "-n", ns)
        containers = [{"name": c["name"], "env": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": server.hostname},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(server.port)}]}
            for c in obj["spec"]["template"]["spec"]["containers"]]
        cluster.kubectl("patch", workload, "-n", ns, "-p", json.dumps({"spec": {"template": {
            "spec": {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                     "containers": containers}}}}))


def test_the_charts_components_run_as_pods_on_the_real_node_and_uninstall_keeps_gpu_pods(
        release: tuple[Release, int], k8s_cluster: Any, real_node: Any,
        k8s_namespace: str) -> None:
    rel, extender_port = release
    cluster, ns = k8s_cluster, rel.namespace
    _network_stand_in(cluster, rel, extender_port)
    for workload in WORKLOADS:
        result = cluster.kubectl("rollout", "status", workload, "-n", ns, "--timeout=180s",
                                 check=False, timeout_s=200)
        if result.returncode != 0:
            pods = cluster.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout
            events = cluster.kubectl("get", "events", "-n", ns).stdout[-3000:]
            raise AssertionError(f"{workload} not available: {result.stderr}\n{pods}\n{events}")
    pods = get(cluster, "pods", "-n", ns)["items"]
    assert pods and all(p["spec"]["nodeName"] == real_node.name for p in pods)
    assert len({p["metadata"]["labels"]["app.kubernetes.io/name"] for p in pods}) == 5
    wait_for("the agent pod's GPUDevices", lambda: len(get(
        cluster, "gpudevices", "-l", f"elasticgpu.io/node={real_node.name}")["items"]) == 2, 60)
    wait_for("nvidia.com/gpu from the agent pod's device plugin in the real kubelet", lambda:
             get(cluster, "node", real_node.name)["status"]["allocatable"].get(
                 "nvidia.com/gpu") == "2", 60)

    gpu_pods = {"whole": {"nvidia.com/gpu": "1"}, "share": {"elasticgpu.io/gpu-core": "30"}}
    for name, limits in gpu_pods.items():
        cluster.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": "elastic-gpu-scheduler",
                     "tolerations": [REAL_NODE_TOLERATION],
                     "containers": [{"name": "main", "image": real_node.busybox_image,
                                     "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env; sleep 3600"],
                                     "resources": {"limits": limits}}]}}))

    def running() -> dict[str, Any]:
        items = {p["metadata"]["name"]: p for p in get(cluster, "pods", "-n", k8s_namespace)
                 ["items"]}
        ok = all(items.get(n, {}).get("status", {}).get("phase") == "Running" for n in gpu_pods)
        return items if ok else {}

    try:
        before = wait_for("the GPU pods Running on the real node", running, 90)
    except AssertionError:
        raise AssertionError(cluster.kubectl("get", "events", "-n", k8s_namespace).stdout[-3000:]
                             + cluster.kubectl("logs", "-n", ns, "deploy/elastic-gpu-scheduler",
                                               check=False).stdout[-2000:]) from None
    for name in gpu_pods:
        assignment = json.loads(before[name]["metadata"]["annotations"]["elasticgpu.io/assignment"])
        assert assignment["node"] == real_node.name == before[name]["spec"]["nodeName"]
        logs = cluster.kubectl("logs", "-n", k8s_namespace, name).stdout
        uuids = {card["uuid"] for card in assignment["containers"]["main"]}
        assert f"NVIDIA_VISIBLE_DEVICES={','.join(sorted(uuids))}" in logs, logs

    rel.helm("uninstall", "egpu")
    wait_for("the components' pods gone", lambda: not get(cluster, "pods", "-n", ns)["items"],
             120)
    time.sleep(2)
    for name in gpu_pods:
        pod = get(cluster, "pod", name, "-n", k8s_namespace)
        assert pod["metadata"]["uid"] == before[name]["metadata"]["uid"]
        assert pod["status"]["phase"] == "Running"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0 and "running" in status["state"]
        # the container itself answers, through the real kubelet
        out = cluster.kubectl("exec", "-n", k8s_namespace, name, "--", "sh", "-c",
                              "echo alive").stdout
        assert out.strip() == "alive"
