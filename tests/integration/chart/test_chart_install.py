"""`helm install` of charts/elastic-gpu on the dev cluster, and `helm uninstall` (issue 18).

The release installs on a real kube-apiserver; `egpu controller`, `egpu scheduler` and `egpu
webhook`, each started as a process with a token of its chart ServiceAccount, become ready
(their RBAC is enough); uninstalling removes the webhook configurations (nothing fails closed
afterwards) while the CRDs stay. The seeds' flows through the installed system are
test_chart_system.py; the components as real pods on the real node, test_chart_realnode.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.chart import CHART, Release, token_kubeconfig
from egpu_testing.controller import ControllerProcess
from egpu_testing.waiting import wait_for
from egpu_testing.webhook import WebhookProcess
from egpu_testing.workbench import ExtenderProcess
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture
def release(k8s_cluster: Any, tmp_path: Path) -> Iterator[Release]:
    rel = Release(k8s_cluster, tmp_path / "helm")
    rel.clear_leftovers()
    # The webhook only for a label no namespace carries: its pods never run here, and GPU pods
    # of other tests must not fail closed on it.
    rel.helm("install", "egpu", str(CHART), "--create-namespace",
             "--set-json", f'webhook.namespaceLabels={json.dumps({"egpu-chart": rel.namespace})}')
    yield rel
    rel.uninstall_quietly()


def _token_kubeconfig(cluster: Any, namespace: str, account: str, path: Path) -> Path:
    return token_kubeconfig(cluster, namespace, account, path)


def test_install_then_the_controller_leads_with_the_charts_token_then_uninstall(
        release: Release, k8s_cluster: Any, tmp_path: Path) -> None:
    status = json.loads(release.helm("status", "egpu", "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    for kind in ("deployment/elastic-gpu-scheduler", "deployment/elastic-gpu-kube-scheduler",
                 "deployment/elastic-gpu-webhook", "deployment/elastic-gpu-controller",
                 "daemonset/elastic-gpu-agent", "secret/elastic-gpu-scheduler-tls"):
        assert release.exists(kind, namespaced=True), kind
    for crd in ("gpudevices", "elasticgpuclaims", "elasticgpus", "elasticgpuclasses"):
        assert release.exists(f"crd/{crd}.elasticgpu.io")

    # The extender's certificates survive an upgrade (lookup of the live Secret).
    before = k8s_cluster.kubectl("get", "secret", "elastic-gpu-scheduler-tls", "-n",
                                 release.namespace, "-o", "json").stdout
    release.helm("upgrade", "egpu", str(CHART), "--reuse-values")
    after = k8s_cluster.kubectl("get", "secret", "elastic-gpu-scheduler-tls", "-n",
                                release.namespace, "-o", "json").stdout
    assert json.loads(after)["data"] == json.loads(before)["data"]

    kubeconfig = _token_kubeconfig(k8s_cluster, release.namespace, "elastic-gpu-controller",
                                   tmp_path / "controller.kubeconfig")
    (port,) = free_ports(1)
    ctl = ControllerProcess(kubeconfig, port, tmp_path / "controller.log",
                            extender_url="http://127.0.0.1:9", identity="chart",
                            lease_namespace=release.namespace)
    ctl.start()
    try:
        wait_for("the controller leads under the chart's ServiceAccount", ctl.leading)
        def lease() -> dict[str, Any]:
            return dict(json.loads(k8s_cluster.kubectl(
                "get", "lease", "egpu-controller", "-n", release.namespace, "-o",
                "json").stdout)["spec"])

        first = lease()
        assert first["holderIdentity"] == "chart"
        # Creating the Lease is one right, renewing it (update) another: see a renewal.
        wait_for("a renewal of the Lease", lambda: lease()["renewTime"] != first["renewTime"],
                 timeout_s=20)
        assert ctl.leading() and lease()["holderIdentity"] == "chart"
        assert "Forbidden" not in ctl.log_path.read_text()
    finally:
        ctl.stop()

    # The extender: its informers (nodes, pods, GPUDevices, classes, claims, ElasticGPUs)
    # sync under the chart's token (/readyz); on loopback without TLS, as in the other tests.
    kubeconfig = _token_kubeconfig(k8s_cluster, release.namespace, "elastic-gpu-scheduler",
                                   tmp_path / "scheduler.kubeconfig")
    (port,) = free_ports(1)
    extender = ExtenderProcess(kubeconfig, port, tmp_path / "scheduler.log")
    extender.start()
    try:
        wait_for("the extender ready under the chart's ServiceAccount", extender.ready)
        assert "Forbidden" not in extender.log_path.read_text()
    finally:
        extender.stop()

    # The webhook: creates its Secret, lists Nodes and applies its caBundle into the
    # configurations helm owns, all under the chart's token (/readyz needs the three).
    kubeconfig = _token_kubeconfig(k8s_cluster, release.namespace, "elastic-gpu-webhook",
                                   tmp_path / "webhook.kubeconfig")
    (port,) = free_ports(1)
    webhook = WebhookProcess(kubeconfig, port, tmp_path / "webhook.log",
                             name="elastic-gpu-webhook", namespace=release.namespace,
                             label=("egpu-chart", release.namespace),
                             # as the chart runs it: the configurations name the Service (an
                             # apply naming a url too would leave both, which is invalid)
                             extra_args=("--service", "elastic-gpu-webhook",
                                         "--service-port", "443"))
    webhook.start()
    try:
        wait_for("the webhook ready under the chart's ServiceAccount", webhook.ready)
        assert release.exists("secret/elastic-gpu-webhook-tls", namespaced=True)
        config = json.loads(k8s_cluster.kubectl(
            "get", "validatingwebhookconfiguration", "elastic-gpu-webhook", "-o", "json").stdout)
        assert config["webhooks"][0]["clientConfig"]["caBundle"]
        assert "Forbidden" not in webhook.log_path.read_text()
    finally:
        webhook.stop()

    release.helm("uninstall", "egpu")
    assert not release.exists("mutatingwebhookconfiguration/elastic-gpu-webhook")
    assert not release.exists("validatingwebhookconfiguration/elastic-gpu-webhook")
    assert not release.exists("clusterrole/elastic-gpu-controller")
    assert release.exists("crd/elasticgpuclaims.elasticgpu.io")  # helm never deletes CRDs


@pytest.mark.parametrize("second_scheduler", [True, False])
def test_notes_say_how_gpu_pods_reach_the_extender(k8s_cluster: Any, tmp_path: Path,
                                                   second_scheduler: bool) -> None:
    rel = Release(k8s_cluster, tmp_path / "helm")
    out = rel.helm("install", "egpu", str(CHART), "--dry-run=client",
                   "--set", f"scheduler.kubeScheduler.enabled={str(second_scheduler).lower()}"
                   ).stdout
    notes = out[out.index("NOTES:"):]
    assert "kubectl apply --server-side -f charts/elastic-gpu/crds/" in notes
    if second_scheduler:
        assert "schedulerName: elastic-gpu-scheduler" in notes
        assert "extenders:" not in notes
    else:
        stanza = yaml.safe_load(notes[notes.index("  extenders:"):notes.index(
            "    managedResources:")])
        assert stanza["extenders"][0]["urlPrefix"] == \
            f"https://elastic-gpu-scheduler.{rel.namespace}.svc:8888"
        assert stanza["extenders"][0]["enableHTTPS"] is True
