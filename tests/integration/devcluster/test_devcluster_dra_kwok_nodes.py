"""DRA-mode fake nodes through the test helpers (`fake_gpu_nodes` with the mode label) and the
stand-in agent's slice sync: slices published at registration from the node's inventory, the
same on a re-registration (no new generation), put back by `DraSliceSync` after they are
deleted, and removed with the node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from elastic_gpu.agent.dra.slices_api import existing_slices
from elastic_gpu.api.gpudevice import NODE_LABEL
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.dra_nodes import DraSliceSync
from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_node, unregister_fake_node
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import GPUDEVICES, NODES, RESOURCE_SLICES

pytestmark = pytest.mark.integration


def test_a_dra_node_from_the_helpers_has_slices_and_no_gpudevices(
        k8s_cluster: ControlPlane, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    kube = k8s_cluster.kube()
    [name] = fake_gpu_nodes(1, gpus=2, labels={GPU_MODE_LABEL: "dra"}, prefix="dra")
    node = kube.get(NODES.path(name=name))
    assert node["metadata"]["labels"][GPU_MODE_LABEL] == "dra"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert node["status"]["allocatable"]["node.elasticgpu.io/gpu-core"] == "200"
    try:
        devices, _ = kube.list(GPUDEVICES.path(), {"labelSelector": f"{NODE_LABEL}={name}"})
    except NotFound:  # no GPUDevice CRD yet: a DRA node installs none
        devices = []
    assert devices == []
    slices = existing_slices(kube, name)
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert slices[0]["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    # registering it again publishes the same devices (that it writes no new generation is
    # slices_api's: it compares quantities as numbers on the kubelet plugin's branch; here the
    # API server's 80Gi for 81920Mi still reads as a change)
    register_fake_node(kube, replace(fake_inventory(name, gpus=2),
                                     labels={GPU_MODE_LABEL: "dra"}))
    again = existing_slices(kube, name)
    assert [d["name"] for s in again for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    # the stand-in agent puts deleted slices back
    sync = DraSliceSync(kube)
    sync.sync()  # its first pass publishes all: nothing to write
    for s in slices:
        kube.delete(RESOURCE_SLICES.path(name=s["metadata"]["name"]))
    assert sync.sync() == 0  # unchanged nodes are skipped between full passes ...
    sync.full_every = 1
    assert sync.sync() == 1  # ... and a full pass restores them
    assert len(existing_slices(kube, name)) == 1
    unregister_fake_node(kube, name)
    assert existing_slices(kube, name) == []
