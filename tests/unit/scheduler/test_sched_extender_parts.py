"""The extender's parts joined by one handle: the bind reads a watched pod once, from the
state, and binds it with what the state knows of it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler import binder
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.leadership import Role
from elastic_gpu.scheduler.state import PodInfo

NODES = [Node("n0", 64_000, 256_000, (Card(0, "GPU-0", "A100", 16384),))]


class RecordingApi:
    """PodApi: records each Binding's precondition; a pod read is never expected."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, int | None]] = []

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("a watched pod is not read from the API")

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        self.bound.append((f"{namespace}/{name}", node, resource_version))


async def test_a_watched_pods_bind_reads_it_once_from_the_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[Mapping[str, Any]] = []

    class CountingPodInfo(PodInfo):
        @staticmethod
        def from_manifest(pod: Mapping[str, Any]) -> PodInfo:
            parsed.append(pod)
            return PodInfo.from_manifest(pod)

    monkeypatch.setattr(binder, "PodInfo", CountingPodInfo)
    api = RecordingApi()
    extender = Extender(ready_state(NODES), api)
    pod = pod_manifest("w", uid="uid-w", limits={"elasticgpu.io/gpu-core": "30"})
    pod["metadata"]["resourceVersion"] = "12"
    extender.state.observe_pod(pod)  # as the pod watch delivers it
    body = {"PodName": "w", "PodNamespace": "default", "PodUID": "uid-w", "Node": "n0"}
    answer = await extender.bind(json.dumps(body).encode())
    assert json.loads(answer.body) == {"Error": ""}
    # the Binding carries the watched version as its precondition, read from the state's
    # PodInfo: the bind built none of its own
    assert api.bound == [("default/w", "n0", 12)]
    assert parsed == []


def test_the_role_given_to_the_extender_is_the_one_its_routes_ask() -> None:
    role = Role(elected=True)
    extender = Extender(ready_state(NODES), role=role)
    assert extender.role is role and not extender.role.serving
    role.set(True, "leading")
    assert extender.handle.role.serving
