"""A merge-back whose MIG mode off waits for a GPU reset (issue 42), told to the operator by
the running agent against a real kube-apiserver: the DRA agent (in-process, over the scripted
NVML with a card the driver cannot switch without a reset; no kubelet, as the DRA agent's own
tests) puts one Warning Event `MigPendingReset` on the MigLayout naming the card and the
command, its `/metrics` page says `elasticgpu_agent_mig_pending_reset` 1 for the card, and the
card device is published tainted with its mode; after the operator's reset, the layout is
applied, the gauge 0 and the card device untainted."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scripted_nvml import SimNvml, two_gpus
from egpu_testing.waiting import wait_for
from egpu_testing.workbench import metric_value, metrics_text
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.dra.slices_api import existing_slices, withdraw_node_slices
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.dra.devices import MIG_MODE_TAINT
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import EVENTS, MIG_LAYOUTS, NODES
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

GAUGE = "elasticgpu_agent_mig_pending_reset"


@pytest.fixture
def api(k8s_cluster: Any) -> Iterator[SyncKubeClient]:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    with SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig),
                                    field_manager="egpu-dev") as client:
        yield client


@pytest.fixture
def node(api: SyncKubeClient) -> Iterator[str]:
    name = unique_name("migreset")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    api.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {GPU_MODE_LABEL: "dra", MIG_DYNAMIC_LABEL: "true"}},
        "status": {"capacity": resources, "allocatable": resources}})
    yield name
    withdraw_node_slices(api, name)
    with contextlib.suppress(NotFound):
        api.delete(NODES.path(name=name))


def test_a_pending_reset_is_told_by_an_event_and_the_gauge_until_the_reset(
        monkeypatch: pytest.MonkeyPatch, api: SyncKubeClient, node: str) -> None:
    gpus = two_gpus()
    gpus[0].mig = [("MIG-a-1", 3, 40192, 0)]
    gpus[0].reset_needed = True  # an A100 the driver cannot switch without a reset
    SimNvml(monkeypatch, gpus)
    root = Path(tempfile.mkdtemp(prefix="egpu-rst-"))  # short: unix socket paths
    config = parse_config({"usage": {"enabled": False}, "syncSeconds": 3600,
                           "healthCheck": {"enabled": False}, "dra": {
                               "enabled": True, "pluginDirectory": str(root / "plugin"),
                               "registryDirectory": str(root / "registry"),
                               "cdiDirectory": str(root / "cdi")}})
    layout = ml.layout_spec(node, "GPU-aaaa", [])  # merge back: MIG mode off
    name = layout["metadata"]["name"]
    agent = Agent(config, NvmlBackend(), node, client=api)
    try:
        url = f"http://127.0.0.1:{agent.serve_metrics('127.0.0.1', 0)}"
        agent.start()
        api.create(MIG_LAYOUTS.path(), layout)
        uid = api.get(MIG_LAYOUTS.path(name=name))["metadata"]["uid"]

        def told() -> list[dict[str, Any]]:
            events, _ = api.list(EVENTS.path(namespace="default"), {
                "fieldSelector": f"involvedObject.uid={uid}"})
            return [e for e in events if e.get("reason") == "MigPendingReset"]

        (event,) = wait_for("the MigPendingReset Event", told, timeout_s=60)
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "MigLayout"
        assert "GPU 0 (GPU-aaaa" in event["message"]
        assert "nvidia-smi -r -i 0" in event["message"]

        def gauge() -> float | None:
            return metric_value(metrics_text(url), f'{GAUGE}{{node="{node}",device_index="0"}}')

        assert gauge() == 1
        assert metric_value(metrics_text(url), f'{GAUGE}{{node="{node}",device_index="1"}}') == 0
        assert api.get(MIG_LAYOUTS.path(name=name))["status"]["phase"] == "PendingReset"

        def mode_taint() -> str | None:
            device = next(d for s in existing_slices(api, node)
                          for d in s["spec"].get("devices") or [] if d["name"] == "gpu-0")
            return next((t["value"] for t in device.get("taints") or []
                         if t["key"] == MIG_MODE_TAINT), None)

        assert mode_taint() == "on-pending-off"
        SimNvml.reset(gpus[0])  # the operator: nvidia-smi -r
        wait_for("the layout applied after the reset", lambda: api.get(
            MIG_LAYOUTS.path(name=name))["status"]["phase"] == "Applied", timeout_s=60)
        assert gauge() == 0 and mode_taint() is None
        (again,) = told()  # once per pending reset: one Event, never bumped
        assert again.get("count", 1) == 1
    finally:
        agent.stop()
        with contextlib.suppress(NotFound):
            api.delete(MIG_LAYOUTS.path(name=name))
        shutil.rmtree(root, ignore_errors=True)
