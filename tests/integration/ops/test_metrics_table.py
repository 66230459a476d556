"""docs/metrics.md against what the running system exposes (issue #18, must-show 3).

Every component runs as its own process against a real kube-apiserver: the extender, an agent
(fake backend, a kubelet double for its device plugins), the webhook and the controller. One
GPU pod is bound on the agent's node so the per-card and per-container series have samples
and their labels are checked too. Each /metrics page is then held against the table both
ways (`egpu_testing.metricsdoc.check_page`): an `elasticgpu_` family exposed and not listed,
or listed for a component and not exposed by it, fails the test. Rows of other parts of the
project (budgets, MIG moves) are checked the same way as they are added to the table.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.controller import ControllerProcess
from egpu_testing.kubelet import KubeletDouble
from egpu_testing.metricsdoc import check_page, metrics_table
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import wait_extender_knows
from egpu_testing.webhook import running_webhook
from egpu_testing.workbench import ExtenderProcess, metric_value, metrics_text, pod_manifest
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

CORE = "elasticgpu.io/gpu-core"


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return str(response.read().decode())


def wait_for(what: str, check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def agent_node(k8s_cluster: Any) -> Iterator[str]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.devcluster.nodes import unregister_fake_node

    ensure_crd(k8s_cluster.kube())  # GPUDevice: installed with the system, before agents
    name = unique_name("ops")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"capacity": resources, "allocatable": resources}}))
    yield name
    unregister_fake_node(k8s_cluster.kube(), name)


@pytest.fixture
def agent_metrics(k8s_cluster: Any, agent_node: str) -> Iterator[str]:
    """`egpu agent --metrics-port` for `agent_node` (fake backend, 2 cards): its URL."""
    plugin_dir = Path(tempfile.mkdtemp(prefix="egpu-ops-"))  # unix socket paths are short
    kubelet = KubeletDouble(plugin_dir)
    kubelet.start()
    (plugin_dir / "inv.yaml").write_text("cards: [{model: A100, memoryMiB: 40960}, "
                                         "{model: A100, memoryMiB: 40960}]\n")
    (plugin_dir / "agent.yaml").write_text(
        f"backend: fake\nfake: {{inventory: inv.yaml}}\ndevicePluginDirectory: {plugin_dir}\n"
        "syncSeconds: 3600\n")
    (port,) = free_ports(1)
    log = (plugin_dir / "agent.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "elastic_gpu.cli.main", "agent", "--node", agent_node,
         "--kubeconfig", str(k8s_cluster.kubeconfig), "--config", str(plugin_dir / "agent.yaml"),
         "--metrics-host", "127.0.0.1", "--metrics-port", str(port)],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert process.poll() is None, (plugin_dir / "agent.log").read_text()
            try:
                return bool(scrape(url))
            except OSError:
                return False
        wait_for("the agent's metrics", up)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def test_every_component_exposes_exactly_the_documented_metrics(
        k8s_cluster: Any, k8s_namespace: str, agent_node: str, agent_metrics: str,
        tmp_path: Path) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_crds(k8s_cluster)
    install_elasticgpu_crds(k8s_cluster.kube())  # every CRD the controllers watch
    extender_port, controller_port = free_ports(2)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, extender_port, tmp_path / "extender.log")
    extender.start()
    controller = ControllerProcess(
        k8s_cluster.kubeconfig, controller_port, tmp_path / "controller.log",
        extender_url=extender.url, identity="ops-test", lease_name=unique_name("ops-lease"))
    try:
        wait_extender_knows(extender.url, [agent_node], 2)
        # a GPU pod holding a share of card 1 on the agent's node: per-card and per-container
        # series then have samples, so their labels are checked as well as their names
        share = CardShare(1, f"GPU-fake-{agent_node}-1", 300, 2048)
        pod = pod_manifest("holder", k8s_namespace, limits={CORE: "30"}, annotations={
            ann.ASSIGNMENT: Assignment(agent_node, {"main": (share,)}).to_json(),
            ann.ASSIGNED_NODE: agent_node})
        pod["spec"]["nodeName"] = agent_node
        k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
        container = (f'elasticgpu_scheduler_container_compute_allocated_millicards'
                     f'{{namespace="{k8s_namespace}",pod="holder"}}')
        wait_for("the extender's ledger", lambda: metric_value(
            metrics_text(extender.url), container) == 300)
        wait_for("the agent's view", lambda: metric_value(
            scrape(agent_metrics), "elasticgpu_agent_container_compute_allocated_millicards"
            f'{{namespace="{k8s_namespace}",pod="holder"}}') == 300)
        controller.start()
        wait_for("the controller to lead", controller.leading)
        with running_webhook(k8s_cluster, tmp_path, "ops-hook", "ops-hook") as hook:
            pages = {"scheduler": metrics_text(extender.url), "agent": scrape(agent_metrics),
                     "webhook": hook.get("/metrics")[1], "controller": controller.metrics()}
        rows = metrics_table()
        problems = [p for component, page in pages.items()
                    for p in check_page(rows, component, page)]
        assert problems == []
        # the table is not vacuous: every component exposes what it lists
        assert all(any(r.component == c for r in rows.values()) for c in pages)
    finally:
        controller.stop()
        extender.stop()
