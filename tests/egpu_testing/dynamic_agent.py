"""A running device-plugin agent on a Node opted in to dynamic MIG, over the in-memory API and
a fake backend (its plugins served on real sockets under a short temporary directory): what
the agent's MIG tests drive its `layout_changed` seam with."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

HOST = {"cpu": "16", "memory": "64Gi", "pods": "110"}


class NoPods:
    """A pod source with no pods on the node."""

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    on_node = live_on_node = pending_on_node


@contextmanager
def running_agent(api: MemoryApi, backend: FakeBackend, node: str) -> Iterator[Agent]:
    """The agent of `node` (migStrategy mixed), its GPUDevices published and plugins served;
    stopped and its sockets removed after."""
    root = Path(tempfile.mkdtemp(prefix="egpu-mig-", dir="/tmp"))  # short: socket paths
    api.add(NODES.path(), {"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": node, "labels": {MIG_DYNAMIC_LABEL: "true"}},
                           "status": {"capacity": dict(HOST), "allocatable": dict(HOST)}})
    config = parse_config({"migStrategy": "mixed", "usage": {"enabled": False},
                           "syncSeconds": 3600, "healthCheck": {"enabled": False}})
    agent = Agent(config, backend, node, client=cast(SyncKubeClient, api), pods=NoPods(),
                  plugin_dir=root / "plugins")
    agent.mode.start()
    agent.mode.serve()
    try:
        yield agent
    finally:
        agent.mode.stop()
        shutil.rmtree(root, ignore_errors=True)
