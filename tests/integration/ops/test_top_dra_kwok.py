"""Issue 41, DRA nodes in every view: `egpu top` against a real kube-apiserver shows a kwok DRA
node (its ResourceSlices, published by the agent's own code) and the ResourceClaim allocated
on it, once, with the pod it is reserved for. The allocation is written as kube-scheduler
writes it (the status subresource), so no scheduler is needed. Without the code it covers, a
DRA node has no GPUDevices and top lists it not at all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from elastic_gpu.cli.top import Objects, fetch, render, view_from_objects
from elastic_gpu.core.dra.devices import DRIVER
from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
from elastic_gpu.kube.client import KubeClient

pytestmark = pytest.mark.integration


async def _objects(kubeconfig: Path) -> Objects:
    client = KubeClient.from_config(kubeconfig)
    try:
        return await fetch(client)
    finally:
        await client.close()


def test_top_shows_a_dra_node_and_its_claim(k8s_cluster: Any, k8s_namespace: str,
                                            fake_gpu_nodes: Callable[..., list[str]]) -> None:
    (node,) = fake_gpu_nodes(1, gpus=2, labels={GPU_MODE_LABEL: GPU_MODE_DRA}, prefix="dra")
    ns = k8s_namespace
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "card", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER}}]}}}))
    # the pod it is reserved for (kube-controller-manager drops reservations of pods that do
    # not exist); no scheduler runs it
    pod = json.loads(k8s_cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": ns},
        "spec": {"schedulerName": "nobody", "resourceClaims": [
            {"name": "gpu", "resourceClaimName": "card"}],
            "containers": [{"name": "main", "image": "cuda",
                            "resources": {"claims": [{"name": "gpu"}]}}]}})).stdout)
    k8s_cluster.kubectl("patch", "resourceclaim", "card", "-n", ns, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {
                            "allocation": {"devices": {"results": [{
                                "request": "gpu", "driver": DRIVER, "pool": node,
                                "device": "gpu-1"}]}},
                            "reservedFor": [{"resource": "pods", "name": "trainer",
                                             "uid": pod["metadata"]["uid"]}]}}))
    view = view_from_objects(asyncio.run(_objects(k8s_cluster.kubeconfig)), [node])
    (shown,) = view.nodes
    assert [c.index for c in shown.cards] == [0, 1]
    assert not shown.cards[0].holders
    assert [(h.kind, h.name, h.milli, h.users) for h in shown.cards[1].holders] == [
        ("resourceclaim", f"{ns}/card", 1000, (f"{ns}/trainer",))]
    console = Console(record=True, width=200, color_system=None)
    console.print(render(view))
    assert f"claim {ns}/card used by {ns}/trainer 100%" in console.export_text()
