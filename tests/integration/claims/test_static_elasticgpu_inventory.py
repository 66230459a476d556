"""Issue #26 item 6 on the real control plane, with `egpu controller --only claims`: a
pre-created (static) ElasticGPU is checked against the GPUDevice inventory the agents publish.
Card index 999, a node that does not exist (`ghost-node`) and a uuid that is not the card's at
that index each end `Failed` with the reason, never `Available`; a correct one is `Available`;
a claim naming a Failed one is never bound to it (Pending, ElasticGPUNotAvailable) while a
claim naming the correct one binds; and the check runs again when the inventory changes (the
ghost node's card appears: its ElasticGPU becomes Available).

Without the check every one of them became Available, and the claim bound to index 999."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.controller import ControllerProcess, clean_up
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.api.gpudevice import card_to_object, object_name
from elastic_gpu.core.model import Card
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

CAPACITY = {"elasticgpu.io/gpu-core": 50, "elasticgpu.io/gpu-memory": 8192}


class Inventory:
    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.devices: list[str] = []
        self.egpus: list[str] = []

    def card(self, node: str, index: int, uuid: str) -> None:
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(
            card_to_object(node, Card(index, uuid, "Tesla T4", 16384))))
        self.devices.append(object_name(node, index))

    def egpu(self, name: str, node: str, index: int, uuid: str) -> str:
        name = unique_name(name)
        self.plane.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": api.API_VERSION, "kind": api.EGPU_KIND, "metadata": {"name": name},
            "spec": {"capacity": CAPACITY, "node": node, "cards": [
                {"index": index, "uuid": uuid, "milli": 500, "memoryMiB": 8192}]}}))
        self.egpus.append(name)
        return name

    def status(self, name: str) -> dict[str, Any]:
        out = self.plane.kubectl("get", "egpu", name, "-o", "json").stdout
        return dict(json.loads(out).get("status") or {})


@pytest.fixture
def inventory(k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> Iterator[Inventory]:
    from elastic_gpu.api import gpudevice
    from elastic_gpu.kube.crds import install_crds as install

    install_crds(k8s_cluster)
    install(k8s_cluster.kube(), [gpudevice.crd_manifest()])  # the inventory
    (port,) = free_ports(1)
    ctl = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                            extender_url="http://127.0.0.1:1", identity=unique_name("ctl"),
                            lease_name=unique_name("inventory"), lease_namespace=k8s_namespace,
                            lease=(4, 3, 0.5), extra=["--only", "claims"])
    inv = Inventory(k8s_cluster)
    ctl.start()
    try:
        wait_for("the controller leading", ctl.leading, 120)
        yield inv
    finally:
        ctl.stop()
        clean_up(k8s_cluster, k8s_namespace, (), inv.egpus)
        for device in inv.devices:
            k8s_cluster.kubectl("delete", "gpudevice", device, "--ignore-not-found",
                                "--wait=false", check=False)


def failed_with(inv: Inventory, name: str, reason: str) -> dict[str, Any] | None:
    status = inv.status(name)
    assert status.get("phase") != "Available", f"ElasticGPU {name} became Available: {status}"
    return status if (status.get("phase"), status.get("reason")) == ("Failed", reason) else None


def test_static_elasticgpus_are_checked_against_the_inventory(
        inventory: Inventory, k8s_namespace: str) -> None:
    inv, ns = inventory, k8s_namespace
    node, ghost = unique_name("inv-node"), unique_name("ghost-node")
    for index in (0, 1):
        inv.card(node, index, f"GPU-{node}-{index}")
    far = inv.egpu("idx999", node, 999, f"GPU-{node}-0")
    nowhere = inv.egpu("ghost", ghost, 0, f"GPU-{ghost}-0")
    swapped = inv.egpu("swapped", node, 0, f"GPU-{node}-1")
    good = inv.egpu("good", node, 1, f"GPU-{node}-1")
    checks = ((far, "CardNotFound", "has no card at index 999 (its cards: 0, 1)"),
              (nowhere, "NodeNotFound", f"node '{ghost}' has no GPUDevice"),
              (swapped, "UUIDMismatch", f"card 0 of node {node} is GPU-{node}-0, not "
                                        f"GPU-{node}-1"))
    for name, reason, words in checks:
        status = wait_for(f"ElasticGPU {name} Failed with {reason}",
                          lambda n=name, r=reason: failed_with(inv, n, r), 120)
        assert words in status["message"], status
    wait_for("the correct ElasticGPU Available", lambda: inv.status(good).get("phase")
             == "Available", 120)
    # a claim naming a Failed one is never bound to it; one naming the good one binds
    for claim, egpu in (("on-good", good), ("on-far", far)):
        inv.plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps({
            "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": claim},
            "spec": {"elasticGPUName": egpu,
                     "resources": {"requests": {"elasticgpu.io/gpu-core": 20}}}}))

    def claim(name: str) -> dict[str, Any]:
        return dict(json.loads(inv.plane.kubectl("get", "egpuc", name, "-n", ns, "-o",
                                                 "json").stdout))

    wait_for("the claim on the good ElasticGPU Bound",
             lambda: (claim("on-good").get("status") or {}).get("phase") == "Bound", 120)
    pending = wait_for("the claim on index 999 Pending, ElasticGPUNotAvailable", lambda: next((
        c for c in (claim("on-far").get("status") or {}).get("conditions") or []
        if c.get("reason") == "ElasticGPUNotAvailable"), None), 120)
    assert f"ElasticGPU {far} is Failed" in pending["message"], pending
    assert (claim("on-far").get("status") or {}).get("phase") == "Pending"
    far_obj = json.loads(inv.plane.kubectl("get", "egpu", far, "-o", "json").stdout)
    assert "claimRef" not in far_obj["spec"] and far_obj["status"]["phase"] == "Failed"
    # the inventory changes: the ghost node's card appears, its ElasticGPU is checked again
    inv.card(ghost, 0, f"GPU-{ghost}-0")
    wait_for("the ghost node's ElasticGPU Available once its card is published",
             lambda: inv.status(nowhere).get("phase") == "Available", 120)
    assert "reason" not in inv.status(nowhere)
