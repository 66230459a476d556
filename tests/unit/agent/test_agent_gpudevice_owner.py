"""The GPUDevices a device-plugin agent publishes stay owned by its Node as it is now.

A fresh-clone CI run lost a real node's H100 from the extender's view: the GPUDevices an
earlier Node object of the same name had left still named that Node's uid as their owner, the
agent updated their spec but not the owner, and the garbage collector deleted them under the
new Node. The agent re-owns what exists, and republishes a GPUDevice found deleted."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.node import DevicePluginNode
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.model import Card
from elastic_gpu.kube.resources import GPUDEVICES, NODES
from elastic_gpu.kube.sync import SyncKubeClient

NODE = "n1"
INVENTORY: dict[str, Any] = {"cards": [{"model": "A100", "memoryMiB": 40960},
                                       {"model": "H100", "memoryMiB": 81920}]}
HOST = {"cpu": "16", "memory": "64Gi", "pods": "250"}


class NoPods:
    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    on_node = live_on_node = pending_on_node


def node_object(uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": uid},
            "status": {"capacity": dict(HOST), "allocatable": dict(HOST)}}


def mode_of(api: MemoryApi, tmp_path: Path) -> DevicePluginNode:
    config = parse_config({"usage": {"enabled": False}, "syncSeconds": 3600,
                           "healthCheck": {"enabled": False}})
    agent = Agent(config, FakeBackend.from_dict(INVENTORY, NODE), NODE,
                  client=cast(SyncKubeClient, api), pods=NoPods(), plugin_dir=tmp_path)
    assert isinstance(agent.mode, DevicePluginNode)
    return agent.mode


def owners(api: MemoryApi) -> dict[str, list[str]]:
    return {d["metadata"]["name"]: [o["uid"] for o in d["metadata"].get("ownerReferences", [])]
            for d in api.list(GPUDEVICES.path())[0]}


def models(api: MemoryApi) -> dict[str, str]:
    return {d["metadata"]["name"]: d["spec"]["model"] for d in api.list(GPUDEVICES.path())[0]}


def test_start_re_owns_the_gpudevices_an_earlier_node_of_the_same_name_left(
        tmp_path: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object("uid-new"))
    for index, model in enumerate(("A100", "A100")):  # the earlier Node's cards
        api.add(GPUDEVICES.path(), gd.owned_by_node(
            gd.card_to_object(NODE, Card(index, f"GPU-old-{index}", model, 40960)),
            NODE, "uid-old"))
    mode_of(api, tmp_path).start()
    assert owners(api) == {"n1-gpu0": ["uid-new"], "n1-gpu1": ["uid-new"]}
    assert models(api) == {"n1-gpu0": "A100", "n1-gpu1": "H100"}


def test_sync_republishes_a_gpudevice_found_deleted(tmp_path: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object("uid-1"))
    mode = mode_of(api, tmp_path)
    mode.start()
    api.delete(GPUDEVICES.path(name="n1-gpu1"))  # the garbage collector's doing
    mode.sync()
    assert owners(api) == {"n1-gpu0": ["uid-1"], "n1-gpu1": ["uid-1"]}
    assert models(api)["n1-gpu1"] == "H100"
    status = api.get(GPUDEVICES.path(name="n1-gpu1"))["status"]
    assert (status["health"], status["allocatedMilli"], status["podCount"]) == ("Healthy", 0, 0)


def test_sync_re_owns_the_gpudevices_when_the_node_is_recreated(tmp_path: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object("uid-1"))
    mode = mode_of(api, tmp_path)
    mode.start()
    api.delete(NODES.path(name=NODE))
    api.add(NODES.path(), node_object("uid-2"))  # kubelet registered the node again
    mode.sync()
    assert owners(api) == {"n1-gpu0": ["uid-2"], "n1-gpu1": ["uid-2"]}


def test_the_update_patch_carries_the_owner() -> None:
    obj = gd.owned_by_node(gd.card_to_object(NODE, Card(0, "GPU-0", "H100", 81920)),
                           NODE, "uid-9")
    patch = gd.update_patch(obj)
    assert patch["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-9"}]
    assert "status" not in patch
    unowned = gd.update_patch(gd.card_to_object(NODE, Card(0, "GPU-0", "H100", 81920)))
    assert "ownerReferences" not in unowned["metadata"]
