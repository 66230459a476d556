"""Device plugins over real gRPC on unix sockets, against the kubelet's side of the protocol."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from egpu_testing.kubelet import KubeletDouble
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.plugin import socket_name
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core.model import Health

INVENTORY = {
    "cards": [
        {"model": "A100", "memoryMiB": 40960, "numaNode": 0, "devices": ["/dev/nvidia0"],
         "links": [{"peer": 1, "kind": "nvlink", "count": 12}]},
        {"model": "A100", "memoryMiB": 40960, "numaNode": 1, "devices": ["/dev/nvidia1"],
         "links": [{"peer": 0, "kind": "nvlink", "count": 12}]},
    ],
    "controlDevices": ["/dev/nvidiactl"],
}
CONFIG = {"timeSlicing": {"replicas": 2}, "healthCheck": {"pollSeconds": 0.05}}
GPU = "nvidia.com/gpu"
CORE = "elasticgpu.io/gpu-core"
TFLOPS = "elasticgpu.io/gpu-tflops"


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletDouble]:
    double = KubeletDouble(plugin_dir)
    double.start()
    yield double
    double.stop()


def start_agent(plugin_dir: Path, config: dict[str, Any] = CONFIG) -> tuple[Agent, FakeBackend]:
    backend = FakeBackend.from_dict(INVENTORY, "n1")
    agent = Agent(parse_config(config), backend, "n1", plugin_dir=plugin_dir)
    agent.start()
    return agent, backend


@pytest.fixture
def running(plugin_dir: Path, kubelet: KubeletDouble) -> Iterator[tuple[Agent, FakeBackend]]:
    agent, backend = start_agent(plugin_dir)
    yield agent, backend
    agent.stop()


def test_registers_each_resource_by_socket_name_and_streams_devices(
        running: tuple[Agent, FakeBackend], kubelet: KubeletDouble) -> None:
    assert kubelet.wait_for(lambda: bool(kubelet.devices(GPU)) and bool(kubelet.devices(CORE)))
    by_resource = {r.resource: r for r in kubelet.registrations}
    assert set(by_resource) == {GPU, CORE, TFLOPS}
    assert by_resource[GPU].endpoint == socket_name(GPU) and "/" not in by_resource[GPU].endpoint
    assert by_resource[GPU].options.get_preferred_allocation_available
    assert kubelet.devices(GPU) == {
        "GPU-fake-n1-0::0": "Healthy", "GPU-fake-n1-0::1": "Healthy",
        "GPU-fake-n1-1::0": "Healthy", "GPU-fake-n1-1::1": "Healthy"}
    assert len(kubelet.devices(CORE)) == 200
    assert kubelet.wait_for(lambda: len(kubelet.devices(TFLOPS)) == 2 * 312)  # two A100s


def test_health_flip_and_recovery_reach_kubelet(
        running: tuple[Agent, FakeBackend], kubelet: KubeletDouble) -> None:
    _, backend = running
    assert kubelet.wait_for(lambda: len(kubelet.devices(CORE)) == 200)
    backend.set_health("GPU-fake-n1-1", Health.UNHEALTHY, "XID 79")

    def card1(resource: str, health: str) -> bool:
        devices = kubelet.devices(resource)
        mine = [h for d, h in devices.items() if d.startswith(("GPU-fake-n1-1", "1-"))]
        others = [h for d, h in devices.items() if not d.startswith(("GPU-fake-n1-1", "1-"))]
        return bool(mine) and all(h == health for h in mine) and all(h == "Healthy" for h in others)

    assert kubelet.wait_for(lambda: card1(GPU, "Unhealthy") and card1(CORE, "Unhealthy"), 5)
    backend.set_health("GPU-fake-n1-1", Health.HEALTHY, "recovered")
    assert kubelet.wait_for(lambda: card1(GPU, "Healthy") and card1(CORE, "Healthy"), 5)


def test_reregisters_after_kubelet_restart(
        running: tuple[Agent, FakeBackend], kubelet: KubeletDouble, plugin_dir: Path) -> None:
    assert kubelet.wait_for(lambda: len(kubelet.registrations) == 3)
    kubelet.restart()  # wipes every socket, serves a new kubelet.sock
    assert not (plugin_dir / socket_name(GPU)).exists()
    # the manager's socket watch notices, on its own (nothing here pokes it)
    assert kubelet.wait_for(lambda: len(kubelet.registrations) == 6
                            and bool(kubelet.devices(GPU)) and bool(kubelet.devices(CORE)), 10)
    assert (plugin_dir / socket_name(GPU)).is_socket()
    response = kubelet.allocate(GPU, [["GPU-fake-n1-0::1"]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-fake-n1-0"


def test_plugins_started_before_kubelet_register_when_it_appears(plugin_dir: Path) -> None:
    agent, _ = start_agent(plugin_dir)
    try:
        time.sleep(0.3)
        double = KubeletDouble(plugin_dir)
        double.start()
        try:
            assert double.wait_for(lambda: double.registered(GPU) and double.registered(CORE), 2.0)
        finally:
            double.stop()
    finally:
        agent.stop()


def test_allocate_time_sliced_replica_gives_its_card(
        running: tuple[Agent, FakeBackend], kubelet: KubeletDouble) -> None:
    assert kubelet.wait_for(lambda: kubelet.registered(GPU))
    response = kubelet.allocate(GPU, [["GPU-fake-n1-1::0"], ["GPU-fake-n1-0::1"]])
    first, second = response.container_responses
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-fake-n1-1"
    assert first.envs["EGPU_ISOLATION"] == "time-sliced"
    assert [(d.host_path, d.permissions) for d in first.devices] == [
        ("/dev/nvidiactl", "rw"), ("/dev/nvidia1", "rw")]
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-fake-n1-0"


def test_allocate_refuses_what_it_cannot_serve(
        running: tuple[Agent, FakeBackend], kubelet: KubeletDouble) -> None:
    _, backend = running
    assert kubelet.wait_for(lambda: kubelet.registered(GPU) and kubelet.registered(CORE))
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(GPU, [["GPU-nope::0"]])
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown device IDs" in str(err.value.details())
    # shares need the scheduler's assignment, which lives in the API
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(CORE, [["0-1", "0-2"]])
    assert "no API access" in str(err.value.details())
    backend.set_health("GPU-fake-n1-0", Health.UNHEALTHY, "XID 48")
    assert kubelet.wait_for(lambda: kubelet.devices(GPU).get("GPU-fake-n1-0::0") == "Unhealthy", 5)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(GPU, [["GPU-fake-n1-0::0"]])
    assert "unhealthy" in str(err.value.details())


def test_preferred_allocation_over_grpc_keeps_nvlink_pairs(
        running: tuple[Agent, FakeBackend], kubelet: KubeletDouble) -> None:
    assert kubelet.wait_for(lambda: kubelet.registered(CORE))
    chosen = kubelet.preferred(CORE, ["0-5", "1-1", "1-2", "0-7"], [], 2)
    assert len(chosen) == 2 and len({c.split("-")[0] for c in chosen}) == 1


def test_time_sliced_mig_single_gives_each_chosen_instance(plugin_dir: Path,
                                                           kubelet: KubeletDouble) -> None:
    inventory = {"cards": [{"model": "A100", "memoryMiB": 40960, "mig": [
        {"profile": "3g.20gb", "uuid": "MIG-a", "start": 0},
        {"profile": "3g.20gb", "uuid": "MIG-b", "start": 4}]}]}
    agent = Agent(parse_config({"migStrategy": "single", "timeSlicing": {"replicas": 2}}),
                  FakeBackend.from_dict(inventory, "n1"), "n1", plugin_dir=plugin_dir)
    agent.start()
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 4)
        response = kubelet.allocate(GPU, [["MIG-a::0", "MIG-b::1", "MIG-a::1"]])
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a,MIG-b"
    finally:
        agent.stop()
