"""The MIG adapter beside dynamic MIG: with `mig.dynamic` on, it moves no pod onto a free
instance of a node opted in to dynamic MIG (seen on the sandbox: a `1g.10gb` pod waiting for
its carve was moved to `3g.40gb` onto the instance just carved for a `3g.40gb` pod, which won
it; dynamic MIG then carved a second `3g.40gb` for nothing). The round runs over fixed caches
(`egpu_testing.defrag`'s static informers) and records the writes it would make."""

from __future__ import annotations

import asyncio
from typing import Any

from egpu_testing.defrag import StaticInformers, mig_node_objects, mig_pod
from elastic_gpu.controller.config import ControllerConfig, MigConfig, MigDynamicConfig
from elastic_gpu.controller.manager import Context, Metrics
from elastic_gpu.controller.mig.controller import MigController
from elastic_gpu.controller.provisioning import ExtenderClient
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import GPUDEVICES, NODES, PODS


class WriteClient:
    """Records every create and delete (a move writes its rule, then deletes the pod)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []

    async def create(self, path: str, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.writes.append(("create", obj.get("kind", path)))
        return {**obj, "metadata": {**obj.get("metadata", {}), "uid": "u1"}}

    async def delete(self, path: str, **_: Any) -> None:
        self.writes.append(("delete", path))

    async def get(self, path: str, **_: Any) -> dict[str, Any]:
        raise AssertionError(f"unexpected get {path}")

    async def patch(self, path: str, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        return patch


def _round(dynamic: bool, opted_in: bool) -> list[tuple[str, str]]:
    client = WriteClient()
    informers = StaticInformers()
    config = ControllerConfig(mig=MigConfig(dynamic=MigDynamicConfig(enabled=dynamic)))
    ctx = Context(client, informers, EventRecorder(client, "test"),  # type: ignore[arg-type]
                  Metrics(), ExtenderClient("http://127.0.0.1:1"), "test", config=config)
    controller = MigController(ctx)
    node, device = mig_node_objects("n0", ("3g.40gb",))  # one free 3g.40gb instance
    if opted_in:
        node["metadata"]["labels"] = {MIG_DYNAMIC_LABEL: "true"}
    informers.informer(NODES.path(), "").objects.append(node)
    informers.informer(GPUDEVICES.path(), "").objects.append(device)
    informers.informer(PODS.path(), "").objects.append(mig_pod("m", profile="1g.10gb"))
    asyncio.run(controller.round())
    return [w for w in client.writes if w[0] == "delete" or w[1] == "MIGSubstitution"]


def test_no_pod_is_moved_onto_an_opted_in_nodes_instance_with_dynamic_mig_on() -> None:
    assert _round(dynamic=True, opted_in=True) == []


def test_the_adapter_still_moves_pods_elsewhere() -> None:
    """The same pod is moved (rule, then the pod deleted) where dynamic MIG is off or the node
    is not opted in: the adapter is unchanged there."""
    for dynamic, opted_in in ((False, True), (True, False)):
        writes = _round(dynamic=dynamic, opted_in=opted_in)
        assert [w[0] for w in writes] == ["create", "delete"], (dynamic, opted_in, writes)
