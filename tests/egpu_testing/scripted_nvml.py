"""A scripted NVML: a test double of the `pynvml` module, driven by a table of cards.

`SimNvml(monkeypatch, gpus)` replaces the pynvml functions the NVML backend calls (it calls
them all through the module, `pynvml.nvmlX(...)`) with answers from `gpus`: identity, memory,
NUMA node, NVLinks by remote PCI bus id, MIG instances, usage (compute processes with their
memory, per-process and card utilisation; per MIG instance its memory and compute processes,
with no utilisation, as NVML has none on MIG device handles); faults are scripted too (`init_error`:
the library or driver missing; `Gpu.lost`: a card that stops answering; `wait_error`; XID
events queued with `xid`). Used by the NVML backend's own tests and by the backend conformance
suite (tests/unit/agent/test_backend_conformance.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

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
    numa: int = 0
    #: Usage: (pid, used MiB or None) per compute process; memory used beyond them (leaked
    #: contexts); card utilisation; per-process SM samples (pid, smUtil, timestamp), or None
    #: where the card has no per-process sampling (NotSupported, as in MIG mode).
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    leaked_mib: int = 0
    util: int = 0
    process_util: list[tuple[int, int, int]] | None = field(default_factory=list)
    #: Per MIG instance (by UUID): its compute processes (pid, used MiB or None). The parent
    #: card lists them too (in MIG mode the parent's process list holds every instance's).
    mig_processes: dict[str, list[tuple[int, int | None]]] = field(default_factory=dict)


@dataclass
class Mig:
    parent: Gpu
    uuid: str
    slices: int
    memory_mb: int
    start: int

    @property
    def processes(self) -> list[tuple[int, int | None]]:
        return self.parent.mig_processes.get(self.uuid, [])

    @property
    def lost(self) -> bool:
        return self.parent.lost


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
            "nvmlDeviceGetUUID": lambda h: self.alive(h).uuid,  # a card's or a MIG instance's
            "nvmlDeviceGetName": lambda h: self.alive(h).name,
            "nvmlDeviceGetMemoryInfo": self.memory,
            "nvmlDeviceGetMinorNumber": lambda h: self.alive(h).minor,
            "nvmlDeviceGetNumaNodeId": lambda h: self.alive(h).numa,
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
            "nvmlDeviceGetUtilizationRates": self.utilization,
            "nvmlDeviceGetComputeRunningProcesses": self.running,
            "nvmlDeviceGetProcessUtilization": self.process_utilization,
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
        if isinstance(handle, Mig):  # a MIG device handle: the instance's own memory
            self.alive(handle)
            used = sum(mib or 0 for _, mib in handle.processes)
            return SimpleNamespace(total=handle.memory_mb * MIB, used=used * MIB,
                                   free=(handle.memory_mb - used) * MIB)
        gpu = self.alive(handle)
        used = sum(mib or 0 for _, mib in self.processes(gpu)) + gpu.leaked_mib
        return SimpleNamespace(total=gpu.memory_mib * MIB, used=used * MIB,
                               free=(gpu.memory_mib - used) * MIB)

    @staticmethod
    def processes(gpu: Gpu) -> list[tuple[int, int | None]]:
        """The parent's list: its own processes and every MIG instance's."""
        return [*gpu.processes, *(p for procs in gpu.mig_processes.values() for p in procs)]

    def running(self, handle: Any) -> list[Any]:
        self.alive(handle)
        listed = handle.processes if isinstance(handle, Mig) else self.processes(handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB,
                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, mib in listed]

    def utilization(self, handle: Any) -> Any:
        if isinstance(handle, Mig):  # NVML has no utilisation per MIG instance
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=self.alive(handle).util, memory=0)

    def process_utilization(self, handle: Any, last_seen: int) -> list[Any]:
        gpu = self.alive(handle)
        if gpu.process_util is None:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fresh = [SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, encUtil=0, decUtil=0,
                                 timeStamp=stamp)
                 for pid, sm, stamp in gpu.process_util if stamp > last_seen]
        if not fresh:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh

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
