"""After `helm install` of charts/elastic-gpu, the seeds' flows work through the installed system,
and `helm uninstall` leaves the GPU pods running (issue 18, must-show 2).

Every Elastic GPU component runs as a process under a token of its chart ServiceAccount (no
image can be pulled here, and pods on the dev cluster have no Service network): the agent (fake
backend, a kubelet double) on a kwok node, its token bound to a pod on that node as the
DaemonSet's pod has it, so the chart's own-node admission policy applies; the extender with
the chart's mutual-TLS Secret and its --config ConfigMap; kube-scheduler with the chart's
KubeSchedulerConfiguration (profile `elastic-gpu-scheduler`), only the extender's URL and the
certificate files made local; the webhook; the controller calling the extender with the
chart's client certificate. What stands in for the cluster network: the webhook
configurations helm owns are pointed at the webhook's loopback URL instead of its Service.

Then the seeds' manifests, each with only `schedulerName: elastic-gpu-scheduler` added (what
NOTES.txt tells users; the dev cluster's own default scheduler is not the extender's): the
Elastic GPU README's class, claims and pods, a gpu-manager `tencent.com/vcuda-*` pod, a
nano-gpu `nano-gpu/gpu-percent` pod, an `nvidia.com/gpu` pod and an `nvidia.com/mig-*` pod.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.chart import CHART, Release, token_kubeconfig
from egpu_testing.controller import ControllerProcess
from egpu_testing.kubelet import KubeletDouble
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.seed import SEED_CLASS, seed_claim, seed_pod
from egpu_testing.waiting import wait_for
from egpu_testing.webhook import WebhookProcess
from egpu_testing.workbench import ExtenderProcess, TestPki, pod_manifest
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.nodes import node_manifest, unregister_fake_node
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

SCHEDULER = "elastic-gpu-scheduler"
LABEL = "egpu-chart-system"
ASSIGNMENT = "elasticgpu.io/assignment"
#: two whole A100s and one carved into two MIG instances
INVENTORY = {"cards": [
    {"model": "A100-SXM4-80GB", "memoryMiB": 81920},
    {"model": "A100-SXM4-80GB", "memoryMiB": 81920},
    {"model": "A100-SXM4-80GB", "memoryMiB": 81920,
     "mig": [{"profile": "3g.40gb", "uuid": "MIG-chart-0", "start": 0},
             {"profile": "3g.40gb", "uuid": "MIG-chart-1", "start": 4}]}]}
#: the seeds' request styles other than claims (tests/egpu_testing/workbench.STYLES)
SEED_PODS = {
    "gpu-manager": {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-memory": "16"},
    "nano-gpu": {"nano-gpu/gpu-percent": "25"},
    "nvidia": {"nvidia.com/gpu": "1"},
    "mig": {"nvidia.com/mig-3g.40gb": "1"},
}


class Kubectl:
    """kubectl with another identity's kubeconfig."""

    def __init__(self, cluster: Any, kubeconfig: Path) -> None:
        self.binary = str(cluster.bin_dir / "kubectl")
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=60,
                              check=False)


def get(cluster: Any, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", *args, "-o", "json").stdout))


@pytest.fixture
def release(k8s_cluster: Any, tmp_path: Path) -> Iterator[Release]:
    rel = Release(k8s_cluster, tmp_path / "helm")
    rel.clear_leftovers()
    rel.helm("install", "egpu", str(CHART), "--create-namespace",
             "--set-json", f"webhook.namespaceLabels={json.dumps({LABEL: rel.namespace})}")
    yield rel
    rel.uninstall_quietly()


@pytest.fixture
def gpu_node(k8s_cluster: Any) -> Iterator[str]:
    """A kwok node with no GPUs yet: the agent publishes them."""
    name = unique_name("chart-gpu")
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(
        node_manifest(Node(name, 96_000, 786_432))))
    yield name
    unregister_fake_node(k8s_cluster.kube(), name)


def _chart_tls(cluster: Any, namespace: str, directory: Path) -> TestPki:
    data = get(cluster, "secret", "elastic-gpu-scheduler-tls", "-n", namespace)["data"]
    directory.mkdir()
    for key, value in data.items():
        (directory / key).write_bytes(base64.b64decode(value))
    files = {name: directory / key for name, key in (
        ("ca", "ca.crt"), ("server_cert", "tls.crt"), ("server_key", "tls.key"),
        ("client_cert", "client.crt"), ("client_key", "client.key"))}
    return TestPki(**files, stranger_cert=directory / "none", stranger_key=directory / "none")


def _point_webhooks_at(cluster: Any, url: str) -> None:
    """What the Service network would do: kube-apiserver calls the webhook at `url`."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        config = get(cluster, kind, "elastic-gpu-webhook")
        ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                "value": {"url": url + hook["clientConfig"]["service"]["path"]}}
               for i, hook in enumerate(config["webhooks"])]
        cluster.kubectl("patch", kind, "elastic-gpu-webhook", "--type=json", "-p",
                        json.dumps(ops))


def _start_agent(cluster: Any, release: Release, node: str, work: Path
                 ) -> tuple[subprocess.Popen[str], Path, Kubectl]:
    """`egpu agent` under the chart's agent token, bound to a pod on `node`."""
    pod = f"elastic-gpu-agent-{node}"
    cluster.kubectl("create", "-n", release.namespace, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
        "spec": {"nodeName": node, "serviceAccountName": "elastic-gpu-agent",
                 "containers": [{"name": "agent", "image": "elastic-gpu"}]}}))
    uid = get(cluster, "pod", pod, "-n", release.namespace)["metadata"]["uid"]
    kubeconfig = token_kubeconfig(cluster, release.namespace, "elastic-gpu-agent",
                                  work / "agent.kubeconfig", bound_pod=(pod, uid))
    plugins = work / "plugins"
    (work / "inventory.yaml").write_text(yaml.safe_dump(INVENTORY))
    (work / "agent.yaml").write_text(yaml.safe_dump({
        "backend": "fake", "fake": {"inventory": str(work / "inventory.yaml")},
        "devicePluginDirectory": f"{plugins}/", "migStrategy": "mixed"}))
    log = work / "agent.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "elastic_gpu.cli.main", "agent", "--node", node,
         "--kubeconfig", str(kubeconfig), "--config", str(work / "agent.yaml")],
        stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    return process, log, Kubectl(cluster, kubeconfig)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def test_seed_flows_through_the_installed_system_and_uninstall_keeps_gpu_pods_running(
        release: Release, k8s_cluster: Any, k8s_namespace: str, gpu_node: str,
        start_kube_scheduler: Callable[..., Any], tmp_path: Path) -> None:
    ns, cluster = k8s_namespace, k8s_cluster
    cluster.kubectl("label", "namespace", ns, f"{LABEL}={release.namespace}")
    stop: list[Callable[[], None]] = []
    # a short directory: unix socket paths hold 107 bytes
    work = Path(tempfile.mkdtemp(prefix="egpu-chart-"))
    plugins = work / "plugins"
    plugins.mkdir()
    kubelet = KubeletDouble(plugins)
    kubelet.start()
    stop.append(kubelet.stop)
    stop.insert(0, lambda: shutil.rmtree(work, ignore_errors=True))
    try:
        # -- the agent: publishes the node's cards under its chart token ------------------
        agent, agent_log, as_agent = _start_agent(cluster, release, gpu_node, work)
        stop.append(lambda: _stop(agent))
        wait_for("the agent's GPUDevices", lambda: len(get(
            cluster, "gpudevices", "-l", f"elasticgpu.io/node={gpu_node}")["items"]) == 3, 60)
        capacity = wait_for("the node's GPU capacity patched by the agent", lambda: (
            get(cluster, "node", gpu_node)["status"]["capacity"].get("nvidia.com/mig-3g.40gb")
            and get(cluster, "node", gpu_node)["status"]["capacity"]), 30)
        assert capacity["nvidia.com/gpu"] == "2" and capacity["nvidia.com/mig-3g.40gb"] == "2"
        wait_for("the agent's device plugins registered with kubelet", lambda: all(
            kubelet.registered(r) for r in ("nvidia.com/gpu", "nvidia.com/mig-3g.40gb")), 30)
        # ...and no more: no pod writes, no Secrets, no other node's objects, no CRDs.
        for verb, what in (("delete", "pods"), ("patch", "pods"), ("create", "pods"),
                           ("get", "secrets"), ("update", "customresourcedefinitions"),
                           ("delete", "nodes")):
            answer = as_agent("auth", "can-i", verb, what, "-A").stdout.strip()
            assert answer == "no", (verb, what)
        other = unique_name("chart-other")
        foreign = as_agent("create", "-f", "-", input=json.dumps({
            "apiVersion": "elasticgpu.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": f"{other}-gpu0", "labels": {"elasticgpu.io/node": other}},
            "spec": {"node": other, "index": 0, "uuid": "GPU-x", "model": "A100",
                     "memoryMiB": 40960}}))
        assert foreign.returncode != 0
        assert "an agent writes only the GPUDevices of its own node" in foreign.stderr

        # -- the extender, kube-scheduler, the webhook and the controller -----------------
        tls = _chart_tls(cluster, release.namespace, tmp_path / "tls")
        extender_config = yaml.safe_load(get(cluster, "configmap", "elastic-gpu-scheduler", "-n",
                                             release.namespace)["data"]["scheduler.yaml"])
        (ext_port, hook_port, ctl_port) = free_ports(3)
        extender = ExtenderProcess(
            token_kubeconfig(cluster, release.namespace, "elastic-gpu-scheduler",
                             tmp_path / "scheduler.kubeconfig"),
            ext_port, tmp_path / "scheduler.log", config=extender_config or None, tls=tls)
        extender.start()
        stop.append(extender.stop)
        config = yaml.safe_load(get(cluster, "configmap", "elastic-gpu-kube-scheduler", "-n",
                                    release.namespace)["data"]["config.yaml"])
        assert [p["schedulerName"] for p in config["profiles"]] == [
            SCHEDULER, "hami-scheduler", "kai-scheduler", "volcano"]
        (stanza,) = config["extenders"]
        stanza["urlPrefix"] = extender.url
        stanza["tlsConfig"] = {"certFile": str(tls.client_cert),
                               "keyFile": str(tls.client_key), "caFile": str(tls.ca)}
        config.pop("leaderElection", None)
        scheduler = start_kube_scheduler(config)
        stop.append(scheduler.stop)

        webhook = WebhookProcess(
            token_kubeconfig(cluster, release.namespace, "elastic-gpu-webhook",
                             tmp_path / "webhook.kubeconfig"),
            hook_port, tmp_path / "webhook.log", name="elastic-gpu-webhook",
            namespace=release.namespace, label=(LABEL, release.namespace))
        _point_webhooks_at(cluster, webhook.url)
        webhook.start()
        stop.append(webhook.stop)

        controller = ControllerProcess(
            token_kubeconfig(cluster, release.namespace, "elastic-gpu-controller",
                             tmp_path / "controller.kubeconfig"),
            ctl_port, tmp_path / "controller.log", extender_url=extender.url,
            identity="chart", lease_namespace=release.namespace,
            extra=("--extender-ca", str(tls.ca), "--extender-client-cert",
                   str(tls.client_cert), "--extender-client-key", str(tls.client_key)))
        controller.start()
        stop.append(controller.stop)
        for ready, what in ((extender.ready, "extender"), (webhook.ready, "webhook"),
                            (controller.leading, "controller")):
            wait_for(f"the {what} ready under its chart ServiceAccount", ready)

        # -- the seeds' flows ---------------------------------------------------------------
        def scheduled_by_us(manifest: str) -> str:
            doc = yaml.safe_load(manifest)
            doc["spec"]["schedulerName"] = SCHEDULER
            return json.dumps(doc)

        cluster.kubectl("apply", "-f", "-", input=SEED_CLASS)
        claims = {f"claim-{i}": f"cuda-{i}" for i in (1, 2)}
        for claim, pod in claims.items():
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=seed_claim(claim))
            cluster.kubectl("apply", "-n", ns, "-f", "-",
                            input=scheduled_by_us(seed_pod(pod, claim)))
        for name, limits in SEED_PODS.items():
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(
                pod_manifest(name, ns, limits=limits, scheduler_name=SCHEDULER)))
        pods = [*claims.values(), *SEED_PODS]

        def running() -> dict[str, dict[str, Any]]:
            items = {p["metadata"]["name"]: p for p in get(cluster, "pods", "-n", ns)["items"]}
            done = all(items.get(p, {}).get("status", {}).get("phase") == "Running"
                       for p in pods)
            return items if done else {}

        try:
            before = wait_for("every seed pod Running", running, 90)
        except AssertionError:
            events = cluster.kubectl("get", "events", "-n", ns, check=False).stdout
            raise AssertionError(f"seed pods not Running:\n{events[-3000:]}") from None
        for claim in claims:
            status = get(cluster, "egpuc", claim, "-n", ns)["status"]
            assert status["phase"] == "Bound"
        for name in pods:
            pod = before[name]
            assignment = json.loads(pod["metadata"]["annotations"][ASSIGNMENT])
            assert assignment["node"] == pod["spec"]["nodeName"]
        # the webhook gave the claims' pods their share; the MIG pod got an instance
        (container,) = before["cuda-1"]["spec"]["containers"]
        assert container["resources"]["limits"]["elasticgpu.io/gpu-core"] == "10"
        mig = json.loads(before["mig"]["metadata"]["annotations"][ASSIGNMENT])
        assert mig["containers"]["main"][0]["mig"] == "3g.40gb"
        for log in (agent_log, extender.log_path, webhook.log_path, controller.log_path):
            assert "Forbidden" not in log.read_text(), log

        # -- helm uninstall: the GPU pods keep running ------------------------------------
        release.helm("uninstall", "egpu")
        for halt in reversed(stop):
            halt()
        stop.clear()
        assert not release.exists("mutatingwebhookconfiguration/elastic-gpu-webhook")
        assert not release.exists("clusterrole/elastic-gpu-agent")
        time.sleep(3)  # anything that were to evict or delete them has had its chance
        after = {p["metadata"]["name"]: p for p in get(cluster, "pods", "-n", ns)["items"]}
        for name in pods:
            pod, was = after[name], before[name]
            assert pod["metadata"]["uid"] == was["metadata"]["uid"], name
            assert pod["status"]["phase"] == "Running" and "deletionTimestamp" not in \
                pod["metadata"], name
            assert pod["spec"]["nodeName"] == was["spec"]["nodeName"]
            assert pod["metadata"]["annotations"][ASSIGNMENT] == \
                was["metadata"]["annotations"][ASSIGNMENT]
        assert get(cluster, "egpuc", "claim-1", "-n", ns)["status"]["phase"] == "Bound"
        assert len(get(cluster, "gpudevices", "-l",
                       f"elasticgpu.io/node={gpu_node}")["items"]) == 3
        # Nothing fails closed; a new GPU pod waits for Elastic GPU to come back.
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(
            pod_manifest("later", ns, limits={"nano-gpu/gpu-percent": "10"},
                         scheduler_name=SCHEDULER)))
        time.sleep(2)
        assert not get(cluster, "pod", "later", "-n", ns)["spec"].get("nodeName")
    finally:
        for halt in reversed(stop):
            halt()
        # The seed class retains its ElasticGPUs (cluster-scoped): take this test's away so the
        # shared cluster's other tests list only their own.
        for egpu in get(cluster, "egpu")["items"]:
            if (egpu["spec"].get("claimRef") or {}).get("namespace") == ns:
                cluster.kubectl("delete", "egpu", egpu["metadata"]["name"], "--wait=false",
                                check=False)
