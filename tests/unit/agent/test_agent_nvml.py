"""The NVML backend against nvidia-ml-py with its functions replaced: devices and faults."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from elastic_gpu.agent.backend import BackendError
from elastic_gpu.agent.config import HealthConfig
from elastic_gpu.agent.nvml import NvmlBackend, mig_profile_name
from elastic_gpu.core.model import Health, LinkKind

MIB = 1 << 20


@dataclass
class Gpu:
    uuid: str
    name: str
    memory_mib: int
    bus: str
    minor: int
    nvlinks: list[str] = field(default_factory=list)  # remote bus ids, one per lane
    mig: list[tuple[str, int, int, int]] = field(default_factory=list)  # uuid, slices, MB, start
    lost: bool = False


@dataclass
class Mig:
    parent: Gpu
    uuid: str
    slices: int
    memory_mb: int
    start: int


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SimNvml:
    """Stands in for the driver behind pynvml: what each call returns, and faults."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.events: list[Any] = []
        self.init_error: int | None = None
        self.wait_error: int | None = None
        self.registered: list[str] = []
        functions = {
            "nvmlInit": self.init, "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": lambda i: self.gpus[i],
            "nvmlDeviceGetHandleByUUID": self.by_uuid,
            "nvmlDeviceGetUUID": lambda h: self.alive(h).uuid,
            "nvmlDeviceGetName": lambda h: self.alive(h).name,
            "nvmlDeviceGetMemoryInfo": self.memory,
            "nvmlDeviceGetMinorNumber": lambda h: self.alive(h).minor,
            "nvmlDeviceGetNumaNodeId": lambda h: 0,
            "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=self.alive(h).bus.encode()),
            "nvmlDeviceGetNvLinkState": self.nvlink_state,
            "nvmlDeviceGetNvLinkRemotePciInfo":
                lambda h, link: SimpleNamespace(busId=h.nvlinks[link]),
            "nvmlDeviceGetTopologyCommonAncestor": lambda a, b: pynvml.NVML_TOPOLOGY_SYSTEM,
            "nvmlDeviceGetMigMode": self.mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
            "nvmlDeviceGetMigDeviceHandleByIndex": self.mig_handle,
            "nvmlDeviceGetAttributes": lambda m: SimpleNamespace(
                gpuInstanceSliceCount=m.slices, memorySizeMB=m.memory_mb),
            "nvmlDeviceGetGpuInstanceId": lambda m: m,
            "nvmlDeviceGetGpuInstanceById": lambda h, m: m,
            "nvmlGpuInstanceGetInfo": lambda m: SimpleNamespace(
                placement=SimpleNamespace(start=m.start)),
            "nvmlEventSetCreate": lambda: "set",
            "nvmlEventSetFree": lambda s: None,
            "nvmlDeviceRegisterEvents": lambda h, kinds, s: self.registered.append(h.uuid),
            "nvmlEventSetWait_v2": self.wait,
        }
        for name, fn in functions.items():
            monkeypatch.setattr(pynvml, name, fn)

    def init(self) -> None:
        if self.init_error is not None:
            raise err(self.init_error)

    def alive(self, gpu: Any) -> Any:
        if getattr(gpu, "lost", False):
            raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def by_uuid(self, uuid: str) -> Gpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return self.alive(gpu)
        raise err(pynvml.NVML_ERROR_NOT_FOUND)

    def memory(self, handle: Any) -> Any:
        return SimpleNamespace(total=self.alive(handle).memory_mib * MIB)

    def nvlink_state(self, handle: Gpu, link: int) -> int:
        if link >= len(handle.nvlinks):
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED

    def mig_mode(self, handle: Gpu) -> tuple[int, int]:
        if not handle.mig:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)

    def mig_handle(self, handle: Gpu, slot: int) -> Mig:
        if slot >= len(handle.mig):
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        uuid, slices, memory, start = handle.mig[slot]
        return Mig(handle, uuid, slices, memory, start)

    def wait(self, event_set: Any, timeout_ms: int) -> Any:
        if self.wait_error is not None:
            raise err(self.wait_error)
        if self.events:
            return self.events.pop(0)
        raise err(pynvml.NVML_ERROR_TIMEOUT)

    def xid(self, gpu: Gpu, code: int) -> None:
        self.events.append(SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                           eventData=code, gpuInstanceId=0xFFFFFFFF,
                                           computeInstanceId=0xFFFFFFFF))


def two_gpus() -> list[Gpu]:
    a = Gpu("GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920, "00000000:3B:00.0", 0)
    b = Gpu("GPU-bbbb", "NVIDIA A100-SXM4-80GB", 81920, "00000000:5E:00.0", 1)
    a.nvlinks = ["0000:5e:00.0"] * 12
    b.nvlinks = ["0000:3b:00.0"] * 12
    return [a, b]


def test_discovery_reads_cards_nvlinks_and_device_files(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus.append(Gpu("GPU-cccc", "NVIDIA A100-SXM4-80GB", 81920, "00000000:AF:00.0", 2))
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    cards = backend.discover()
    assert [(c.index, c.uuid, c.memory_mib, c.numa_node) for c in cards] == [
        (0, "GPU-aaaa", 81920, 0), (1, "GPU-bbbb", 81920, 0), (2, "GPU-cccc", 81920, 0)]
    assert cards[0].model == "NVIDIA A100-SXM4-80GB"
    nv = [link for link in cards[0].links if link.kind is LinkKind.NVLINK]
    assert [(link.peer, link.count) for link in nv] == [(1, 12)]
    assert [(link.peer, link.kind) for link in cards[2].links] == [
        (0, LinkKind.SYSTEM), (1, LinkKind.SYSTEM)]
    assert backend.device_nodes(cards[1]) == ("/dev/nvidia1",)
    assert "/dev/nvidiactl" in backend.control_nodes()


def test_mig_instances_get_nvidia_profile_names(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig = [("MIG-1", 3, 40192, 0), ("MIG-2", 1, 9856, 4)]
    SimNvml(monkeypatch, gpus)
    cards = NvmlBackend().discover()
    assert [(m.profile.name, m.uuid, m.start) for m in cards[0].mig] == [
        ("3g.40gb", "MIG-1", 0), ("1g.10gb", "MIG-2", 4)]
    assert cards[1].mig == ()
    assert mig_profile_name(1, 4864).name == "1g.5gb"


def test_no_driver_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimNvml(monkeypatch, [])
    sim.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(BackendError, match="NVIDIA driver not loaded"):
        NvmlBackend()
    sim.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(BackendError, match=r"libnvidia-ml\.so\.1"):
        NvmlBackend()


def test_a_lost_gpu_is_not_advertised(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[1].lost = True
    SimNvml(monkeypatch, gpus)
    assert [c.uuid for c in NvmlBackend().discover()] == ["GPU-aaaa"]


def test_critical_xid_marks_unhealthy_application_xids_do_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    sim = SimNvml(monkeypatch, gpus)
    backend = NvmlBackend(HealthConfig(recoverAfterSeconds=0))
    backend.discover()
    for code in (13, 31, 43, 45, 68):
        sim.xid(gpus[0], code)
        assert backend.wait_health(0.01) == []
    assert sim.registered == ["GPU-aaaa", "GPU-bbbb"]
    sim.xid(gpus[1], 79)
    (event,) = backend.wait_health(0.01)
    assert (event.uuid, event.health, event.reason) == ("GPU-bbbb", Health.UNHEALTHY, "XID 79")
    assert [c.health for c in backend.discover()] == [Health.HEALTHY, Health.UNHEALTHY]


def test_recovery_when_the_driver_answers_again(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    sim = SimNvml(monkeypatch, gpus)
    backend = NvmlBackend(HealthConfig(recoverAfterSeconds=0.05))
    backend.discover()
    sim.xid(gpus[0], 48)
    assert [e.health for e in backend.wait_health(0.01)] == [Health.UNHEALTHY]
    gpus[0].lost = True  # still sick after the delay: stays unhealthy
    time.sleep(0.06)
    assert backend.wait_health(0.01) == []
    gpus[0].lost = False
    time.sleep(0.06)
    (event,) = backend.wait_health(0.01)
    assert (event.uuid, event.health) == ("GPU-aaaa", Health.HEALTHY)


def test_gpu_lost_while_waiting_marks_every_card_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimNvml(monkeypatch, two_gpus())
    backend = NvmlBackend(HealthConfig(recoverAfterSeconds=0))
    backend.discover()
    sim.wait_error = pynvml.NVML_ERROR_GPU_IS_LOST
    events = backend.wait_health(0.01)
    assert sorted(e.uuid for e in events) == ["GPU-aaaa", "GPU-bbbb"]
    assert all(e.health is Health.UNHEALTHY and "GPU is lost" in e.reason for e in events)
