"""The bench loader (egpu_testing.bulkload) sends what devcluster registers, node for node."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest

from egpu_testing.bulkload import Loader, RequestRecorder, jobs_for, pod_request
from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_nodes
from elastic_gpu.kube.errors import Invalid
from elastic_gpu.kube.resources import GPUDEVICES, NODES
from elastic_gpu.kube.transport import ApiStatusError

Sent = tuple[str, str, bytes, str]


class FakeApi:
    """Answers the loader as an API server would: a created Node has uid "uid-<name>"; the
    errors queued for a (method, path) come first, one per request."""

    def __init__(self, failures: Mapping[tuple[str, str], list[ApiStatusError]] | None = None
                 ) -> None:
        self.sent: list[Sent] = []
        self.failures = {key: list(errors) for key, errors in (failures or {}).items()}

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      params: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> bytes:
        queued = self.failures.get((method, path))
        if queued:
            raise queued.pop(0)
        if method == "GET":
            return msgspec.json.encode({"metadata": {"uid": f"uid-{path.rsplit('/', 1)[1]}"}})
        assert body is not None
        self.sent.append((method, path, canonical(msgspec.json.decode(body)), content_type))
        obj = msgspec.json.decode(body)
        if method == "POST" and path == NODES.path():
            return msgspec.json.encode({"metadata": {"uid": f"uid-{obj['metadata']['name']}"}})
        return b"{}"


def canonical(body: Any) -> bytes:
    return msgspec.json.encode(without_heartbeat(body), order="sorted")


def without_heartbeat(body: Any) -> Any:
    """The body with each `lastHeartbeat` (the wall clock's second when it was built) checked
    for shape and masked: the loader and devcluster build theirs at different instants, which
    straddle a second now and then on a busy box."""
    if isinstance(body, dict):
        out = {}
        for key, value in body.items():
            if key == "lastHeartbeat":
                assert isinstance(value, str) and value.endswith("Z"), value
                value = "<heartbeat>"
            out[key] = without_heartbeat(value)
        return out
    if isinstance(body, list):
        return [without_heartbeat(item) for item in body]
    return body


def inventories() -> list[Node]:
    return [fake_inventory("node-1", gpus=2), fake_inventory("node-10", gpus=3),
            fake_inventory("ix-1", gpus=2, gpu_model="BI-V150", gpu_memory_mib=32768,
                           chips_per_board=2)]


def devcluster_sends(nodes: list[Node], agent_config: Any = None) -> list[Sent]:
    recorder = RequestRecorder(uid=lambda name: f"uid-{name}")
    register_fake_nodes(recorder, nodes, new=True, agent_config=agent_config)
    return sorted((r.method, r.path, canonical(r.body), r.content_type)
                  for r in recorder.requests)


def load(api: FakeApi, nodes: list[Node], pods: list[dict[str, Any]] = [],  # noqa: B006
         agent_config: Any = None, concurrency: int = 4) -> Loader:
    async def no_pause(_: float) -> None:
        return None

    loader = Loader(api, sleep=no_pause)
    asyncio.run(loader.run(jobs_for(nodes, pods, agent_config), concurrency))
    return loader


@pytest.mark.parametrize("agent_config", [None, {"timeSlicing": {"replicas": 4}}])
def test_the_loader_sends_what_devcluster_registers(agent_config: Any) -> None:
    api = FakeApi()
    loader = load(api, inventories(), agent_config=agent_config)
    assert sorted(api.sent) == devcluster_sends(inventories(), agent_config)
    # Every card is a GPUDevice owned by its Node's real uid, its status patched after.
    devices = [msgspec.json.decode(body) for method, path, body, _ in api.sent
               if method == "POST" and path == GPUDEVICES.path()]
    assert len(devices) == 2 + 3 + 2
    assert {d["metadata"]["ownerReferences"][0]["uid"] for d in devices} == {
        "uid-node-1", "uid-node-10", "uid-ix-1"}
    assert sum(1 for method, path, _, _ in api.sent
               if method == "PATCH" and path.endswith("/status")) == len(devices)
    assert (loader.report.nodes, loader.report.pods) == (3, 0)


def test_a_node_is_created_with_its_status_in_one_request() -> None:
    api = FakeApi()
    load(api, [fake_inventory("node-1", gpus=8)])
    node_requests = [(m, p) for m, p, _, _ in api.sent if p.startswith(NODES.path())]
    assert node_requests == [("POST", NODES.path())]
    node = msgspec.json.decode(api.sent[0][2])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_pods_are_created_bound_without_the_fields_the_server_assigns() -> None:
    pod = pod_manifest("p-1", uid="u-1", limits={"nvidia.com/gpu": "1"})
    pod["spec"]["nodeName"] = "node-1"
    pod["metadata"]["resourceVersion"] = "1"
    api = FakeApi()
    loader = load(api, [], [pod])
    ((method, path, body, _),) = api.sent
    sent = msgspec.json.decode(body)
    assert (method, path) == ("POST", pod_request(pod).path)
    assert path.endswith(f"/namespaces/{pod['metadata']['namespace']}/pods")
    assert "uid" not in sent["metadata"] and "resourceVersion" not in sent["metadata"]
    assert sent["spec"]["nodeName"] == "node-1"
    assert pod["metadata"]["uid"] == "u-1"  # the caller's object is left as it was
    assert loader.report.pods == 1


def test_a_request_without_a_definite_answer_is_sent_again() -> None:
    timeout = ApiStatusError(0, "", "TimeoutError")
    api = FakeApi({("POST", GPUDEVICES.path()): [timeout, ApiStatusError(503, "", "busy")]})
    loader = load(api, [fake_inventory("node-1", gpus=1)])
    assert loader.report.retries == 2
    assert [m for m, p, _, _ in api.sent if p == GPUDEVICES.path()] == ["POST"]


def test_a_resent_node_create_that_was_applied_reads_the_uid() -> None:
    timeout = ApiStatusError(0, "", "TimeoutError")
    exists = ApiStatusError(409, "AlreadyExists", "exists")
    api = FakeApi({("POST", NODES.path()): [timeout, exists]})
    load(api, [fake_inventory("node-1", gpus=1)])
    (device,) = [msgspec.json.decode(body) for m, p, body, _ in api.sent
                 if m == "POST" and p == GPUDEVICES.path()]
    assert device["metadata"]["ownerReferences"][0]["uid"] == "uid-node-1"


def test_a_definite_refusal_stops_the_load() -> None:
    api = FakeApi({("POST", NODES.path()): [ApiStatusError(422, "Invalid", "bad")]})
    with pytest.raises(Invalid):
        load(api, [fake_inventory("node-1", gpus=1)], concurrency=1)
