"""The real agent process in DRA mode (`egpu agent`, fake backend with its MIG state file,
against a real kube-apiserver; kubelet's side is absent, as in the DRA agent's own tests)
SIGKILLed mid-change of dynamic MIG (issue 42) and restarted: its card was fenced (the slices'
taint) and its first instance created when it died; the restarted agent reads the card's real
layout from the fake's state file (as NVML would read a real card), keeps the fence it finds
in the slices, finishes the layout, and publishes slices that match the card's real layout,
with no fence or taint left; a card a claim holds is never changed, and the independent ledger
check (`egpu_testing.dra_ledger`) finds nothing held twice or lost."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra import allocation, claim_manifest, result
from egpu_testing.dra_ledger import over_capacity
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.agent.backends.fake import FakeBackend, parse_inventory
from elastic_gpu.agent.dra.slices_api import existing_slices, withdraw_node_slices
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.dra.devices import FENCE_TAINT
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.model import Health, Node
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import MIG_LAYOUTS, NODES, PODS, RESOURCE_CLAIMS
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

CRASH = Path(__file__).resolve().parents[2] / "egpu_testing" / "real_agent_crash.py"
A100 = "A100-SXM4-80GB"
INVENTORY = {"cards": [{"model": A100, "memoryMiB": 81920}, {"model": A100, "memoryMiB": 81920}]}
P3 = MigProfile.parse("3g.40gb")
DEADLINE_S = 90.0


@pytest.fixture
def api(k8s_cluster: Any) -> Iterator[SyncKubeClient]:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())  # MigLayouts among them
    with SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig),
                                    field_manager="egpu-dev") as client:
        yield client


@pytest.fixture
def node(api: SyncKubeClient) -> Iterator[str]:
    name = unique_name("migdra")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    api.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {GPU_MODE_LABEL: "dra", MIG_DYNAMIC_LABEL: "true"}},
        "status": {"capacity": resources, "allocatable": resources}})
    yield name
    withdraw_node_slices(api, name)
    with contextlib.suppress(NotFound):
        api.delete(NODES.path(name=name))


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="egpu-mig-"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


class AgentProcess:
    """`egpu agent` for `node` in DRA mode over the fake backend with its MIG state file."""

    def __init__(self, k8s_cluster: Any, node: str, root: Path) -> None:
        self.root = root
        (root / "inventory.yaml").write_text(json.dumps(INVENTORY))
        (root / "agent.yaml").write_text(json.dumps({
            "backend": "fake", "fake": {"inventory": str(root / "inventory.yaml"),
                                        "migState": str(self.state)},
            "sharing": {"mode": "mps"}, "syncSeconds": 3600, "usage": {"enabled": False},
            "dra": {"enabled": True, "pluginDirectory": str(root / "plugin"),
                    "registryDirectory": str(root / "registry"),
                    "cdiDirectory": str(root / "cdi")}}))
        self.args = ["agent", "--node", node, "--kubeconfig", str(k8s_cluster.kubeconfig),
                     "--config", str(root / "agent.yaml")]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def state(self) -> Path:
        return self.root / "state" / "fake-mig.json"

    def start(self, log: str, crash: bool = False) -> subprocess.Popen[bytes]:
        command = [str(CRASH)] if crash else ["-m", "elastic_gpu.cli.main"]
        with (self.root / log).open("w") as out:
            self.process = subprocess.Popen([sys.executable, *command, *self.args],
                                            stdout=out, stderr=subprocess.STDOUT)
        return self.process

    def log(self, name: str) -> str:
        return (self.root / name).read_text()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def real_cards(self, node: str) -> list[Any]:
        """The cards as they really are: the inventory with the fake's state file (what NVML
        would read of a real card), read apart from the agent process."""
        return list(FakeBackend(parse_inventory(INVENTORY, "test"), node,
                                mig_state=self.state).discover())


def holder_claim(api: SyncKubeClient, namespace: str, node: str) -> dict[str, Any]:
    """A claim allocated card 0 whole, reserved for a Pod on the node (as kube-scheduler
    leaves it)."""
    api.create(RESOURCE_CLAIMS.path(namespace=namespace), claim_manifest("whole", namespace))
    pod = api.create(PODS.path(namespace=namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "whole-user"},
        "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu",
                                                        "resourceClaimName": "whole"}],
                 "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})
    claim = api.get(RESOURCE_CLAIMS.path(namespace=namespace, name="whole"))
    claim["status"] = {"allocation": allocation(node, [result(node, "gpu-0")]), "reservedFor": [
        {"resource": "pods", "name": "whole-user", "uid": pod["metadata"]["uid"]}]}
    return api.update(RESOURCE_CLAIMS.path(namespace=namespace, name="whole",
                                           subresource="status"), claim)


def tainted(api: SyncKubeClient, node: str) -> list[str]:
    return sorted(d["name"] for s in existing_slices(api, node)
                  for d in s["spec"].get("devices") or []
                  if any(t.get("key") == FENCE_TAINT for t in d.get("taints") or []))


def test_the_real_dra_agent_killed_mid_change_finishes_the_layout_when_restarted(
        k8s_cluster: Any, api: SyncKubeClient, node: str, root: Path,
        k8s_namespace: str) -> None:
    agent = AgentProcess(k8s_cluster, node, root)
    holder_claim(api, k8s_namespace, node)
    card = f"GPU-fake-{node}-1"
    layout = ml.layout_spec(node, card, [Placed(0, P3), Placed(4, P3)])
    name = layout["metadata"]["name"]
    api.create(MIG_LAYOUTS.path(), layout)
    try:
        crashing = agent.start("crash.log", crash=True)
        wait_for("the agent's SIGKILL after its first MIG step",
                 lambda: crashing.poll() is not None, timeout_s=DEADLINE_S)
        assert crashing.returncode == -signal.SIGKILL, agent.log("crash.log")
        # mid-change: one instance made (the card's state), the slices still the whole card,
        # fenced; the MigLayout not applied
        assert [(m.start, m.profile.name) for m in agent.real_cards(node)[1].mig] == [(0, "3g.40gb")]
        assert tainted(api, node) == ["gpu-1"]
        assert api.get(MIG_LAYOUTS.path(name=name)).get("status", {}).get("phase") != "Applied"

        agent.start("agent.log")

        def applied() -> bool:
            assert agent.process is not None and agent.process.poll() is None, \
                agent.log("agent.log")
            status = api.get(MIG_LAYOUTS.path(name=name)).get("status") or {}
            return status.get("phase") == "Applied" and not tainted(api, node)

        wait_for("the layout applied and the fence lifted", applied, timeout_s=DEADLINE_S)
        real = agent.real_cards(node)
        assert [(m.start, m.profile.name) for m in real[1].mig] == [(0, "3g.40gb"),
                                                                   (4, "3g.40gb")]
        assert real[0].mig == ()  # the held card never changed
        published = node_cards(existing_slices(api, node))[node]
        assert [(c.index, c.uuid, c.mig, c.health) for c in published] == \
            [(c.index, c.uuid, c.mig, Health.HEALTHY) for c in real]
        status = api.get(MIG_LAYOUTS.path(name=name))["status"]
        assert [i["uuid"] for i in status["instances"]] == [m.uuid for m in real[1].mig]
        claims, _ = api.list(RESOURCE_CLAIMS.path(namespace=k8s_namespace))
        assert over_capacity([], claims, [Node(node, 0, 0, tuple(real))]) == []
    finally:
        agent.stop()
        with contextlib.suppress(NotFound):
            api.delete(MIG_LAYOUTS.path(name=name))
