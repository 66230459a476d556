"""The node-mode contract (`agent.nodemode.NodeMode`), held by every implementation: the
device-plugin node and the DRA node, each built by the agent's runtime from its config and
run against an in-memory API. What differs between modes (GPUDevices or ResourceSlices) is
checked in their own tests; here, what the runtime relies on from any mode."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.backends.base import HealthEvent
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.node import DevicePluginNode
from elastic_gpu.agent.dra.node import DraNode
from elastic_gpu.agent.nodemode import NodeMode, NodeModeError
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
from elastic_gpu.core.model import Health
from elastic_gpu.core.quota import with_accounting
from elastic_gpu.kube.resources import GPUDEVICES, NODES, RESOURCE_SLICES
from elastic_gpu.kube.sync import SyncKubeClient

NODE = "n1"
INVENTORY: dict[str, Any] = {"cards": [{"model": "A100", "memoryMiB": 40960},
                                       {"model": "A100", "memoryMiB": 40960}]}
HOST = {"cpu": "16", "memory": "64Gi", "pods": "250"}


class NoPods:
    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    on_node = live_on_node = pending_on_node


@dataclass(frozen=True)
class Kind:
    """One node mode: its config, the label its Node group carries, its class and where its
    cards are published."""

    name: str
    config: dict[str, Any]
    label: str | None
    mode: type
    cards_path: str


KINDS = [Kind("device-plugin", {}, None, DevicePluginNode, GPUDEVICES.path()),
         Kind("dra", {"dra": {"enabled": True}}, GPU_MODE_DRA, DraNode,
              RESOURCE_SLICES.path())]


@pytest.fixture(params=KINDS, ids=[kind.name for kind in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    return cast(Kind, request.param)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="egpu-modes-", dir="/tmp"))  # short: socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def node_object(label: str | None) -> dict[str, Any]:
    labels = {GPU_MODE_LABEL: label} if label is not None else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels},
            "status": {"capacity": dict(HOST), "allocatable": dict(HOST)}}


def agent_of(kind: Kind, api: MemoryApi, root: Path) -> Agent:
    dirs = {"dra": {**kind.config["dra"], "pluginDirectory": str(root / "dra"),
                    "registryDirectory": str(root / "registry"),
                    "cdiDirectory": str(root / "cdi")}} if "dra" in kind.config else {}
    config = parse_config({"usage": {"enabled": False}, "syncSeconds": 3600,
                           "healthCheck": {"enabled": False}, **dirs})
    return Agent(config, FakeBackend.from_dict(INVENTORY, NODE), NODE,
                 client=cast(SyncKubeClient, api), pods=NoPods(), plugin_dir=root / "plugins")


def gpu_status(api: MemoryApi, field: str) -> dict[str, str]:
    status = api.get(NODES.path(name=NODE))["status"][field]
    return {k: v for k, v in status.items() if k not in HOST}


def test_the_runtime_picks_the_mode_its_config_names(kind: Kind, root: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object(kind.label))
    assert isinstance(agent_of(kind, api, root).mode, kind.mode)


def test_start_refuses_the_other_modes_node_before_writing_anything(kind: Kind,
                                                                     root: Path) -> None:
    other = next(k for k in KINDS if k is not kind)
    api = MemoryApi()
    api.add(NODES.path(), node_object(other.label))
    mode: NodeMode = agent_of(kind, api, root).mode
    with pytest.raises(NodeModeError, match=f"Node {NODE}"):
        mode.start()
    assert api.writes == []


def test_start_publishes_the_cards_and_the_capacity_it_says(kind: Kind, root: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object(kind.label))
    mode: NodeMode = agent_of(kind, api, root).mode
    mode.start()
    capacity, allocatable = mode.capacity()
    assert capacity and gpu_status(api, "capacity") == with_accounting(capacity)
    assert gpu_status(api, "allocatable") == with_accounting(allocatable)
    assert api.list(kind.cards_path)[0] != []
    # the other mode's objects are not written
    other = next(k for k in KINDS if k is not kind)
    assert api.list(other.cards_path)[0] == []


def test_a_health_change_is_published_as_the_capacity_then_says(kind: Kind,
                                                                root: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object(kind.label))
    agent = agent_of(kind, api, root)
    agent.mode.start()
    agent.state.apply([HealthEvent(f"GPU-fake-{NODE}-1", Health.UNHEALTHY, "Xid 79")])
    agent.mode.cards_changed()
    capacity, allocatable = agent.mode.capacity()
    assert gpu_status(api, "capacity") == with_accounting(capacity)
    assert gpu_status(api, "allocatable") == with_accounting(allocatable)


def test_sync_restores_the_capacity_a_restarting_kubelet_zeroed(kind: Kind,
                                                                root: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object(kind.label))
    mode = agent_of(kind, api, root).mode
    mode.start()
    zeroed = {k: "0" for k in gpu_status(api, "capacity")}
    api.patch(NODES.path(name=NODE, subresource="status"),
              {"status": {"capacity": zeroed, "allocatable": zeroed}})
    mode.sync()
    capacity, allocatable = mode.capacity()
    assert gpu_status(api, "capacity") == with_accounting(capacity)
    assert gpu_status(api, "allocatable") == with_accounting(allocatable)


def test_no_grants_yet_and_stop_keeps_what_was_published(kind: Kind, root: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object(kind.label))
    mode = agent_of(kind, api, root).mode
    mode.start()
    assert mode.outcomes() == Counter()
    published = api.list(kind.cards_path)[0]
    mode.serve()
    mode.stop()
    # kube-scheduler (or the extender) keeps seeing the cards it handed out while the agent
    # restarts
    assert api.list(kind.cards_path)[0] == published


def test_holdings_keep_the_pods_a_mode_has_nothing_to_add_to(kind: Kind, root: Path) -> None:
    api = MemoryApi()
    api.add(NODES.path(), node_object(kind.label))
    mode = agent_of(kind, api, root).mode
    pods = [{"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": NODE}}]
    # nothing prepared (DRA) or an assignment already there (device plugin): as they are
    assert mode.holdings(pods) == pods
