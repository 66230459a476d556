"""A scripted NVML: a test double of the `pynvml` module, driven by a table of cards.

`SimNvml(monkeypatch, gpus)` replaces the pynvml functions the NVML backend calls (it calls
them all through the module, `pynvml.nvmlX(...)`) with answers from `gpus`: identity, memory,
NUMA node, NVLinks by remote PCI bus id, MIG instances, usage (compute processes with their
memory, per-process and card utilisation; per MIG instance its memory and compute processes,
with no utilisation, as NVML has none on MIG device handles); faults are scripted too (`init_error`:
the library or driver missing; `Gpu.lost`: a card that stops answering; `wait_error`; XID
events queued with `xid`). MIG layouts can be changed as on an 80 GB A100/H100: MIG mode
(`reset_needed` keeps a change pending, with activation status `RESET_REQUIRED`, until the
operator's reset, `SimNvml.reset`; MIG mode off is refused while the card has instances), GPU
instances at a placement (refused where slices are
taken), compute instances (`ci_error` fails the next), destroyed in that order (`In Use` while
a process runs), and GPU instances left with no compute instance (`Gpu.gis`).
Used by the NVML backend's own tests and by the backend conformance
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
    #: MIG mode set with no instance yet; a mode change that waits for a GPU reset
    mig_mode_on: bool = False
    reset_needed: bool = False
    #: the mode a change waiting for a reset will set (None: no change waits)
    pending_on: bool | None = None
    #: GPU instances with no compute instance (a carve interrupted between the two)
    gis: list[Gi] = field(default_factory=list)
    #: the next compute instance creation fails with this NVML error code
    ci_error: int | None = None

    @property
    def mig_capable(self) -> bool:
        return any(model in self.name for model in ("A100", "H100", "A30", "H200"))


#: NVML's GPU instance profiles of an 80 GB A100 / H100: id -> (name, sliceCount,
#: memorySizeMB, placement size in memory slices)
PROFILES_80GB: dict[int, tuple[str, int, int, int]] = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: ("1g.10gb", 1, 9856, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: ("1g.10gb+me", 1, 9856, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: ("1g.20gb", 1, 19968, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: ("2g.20gb", 2, 19968, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: ("3g.40gb", 3, 40192, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: ("4g.40gb", 4, 40192, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: ("7g.80gb", 7, 81152, 8),
}


def memory_slices(slices: int, memory_mb: int) -> int:
    return next((size for _, g, mb, size in PROFILES_80GB.values()
                 if (g, mb) == (slices, memory_mb)), max(1, round(memory_mb / 10240)))


@dataclass
class Gi:
    """A GPU instance with no compute instance yet (scripted; ids from 16 on)."""

    parent: Gpu
    gid: int
    profile_id: int
    start: int


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
        for gpu in gpus:  # a card with instances is in MIG mode, and stays so without them
            gpu.mig_mode_on = gpu.mig_mode_on or bool(gpu.mig)
        self.events: list[Any] = []
        self.init_error: int | None = None
        self.wait_error: int | None = None
        self.registered: list[str] = []
        #: MIG devices created, by UUID; GPU instance ids handed out from 16 on
        self.created: list[str] = []
        self.next_gi = 15
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
            "nvmlDeviceGetComputeInstanceId": lambda m: 0,
            "nvmlDeviceGetGpuInstanceById": self.gpu_instance,
            "nvmlGpuInstanceGetInfo": lambda m: SimpleNamespace(
                placement=SimpleNamespace(start=m.start)),
            "nvmlDeviceSetMigMode": self.set_mig_mode,
            "nvmlDeviceGetGpuInstanceProfileInfo": self.profile_info,
            "nvmlDeviceGetGpuInstancePossiblePlacements": self.placements,
            "nvmlDeviceCreateGpuInstanceWithPlacement": self.create_gi,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo":
                lambda gi, profile, engine: SimpleNamespace(id=profile),
            "nvmlGpuInstanceCreateComputeInstance": self.create_ci,
            "nvmlGpuInstanceGetComputeInstanceById": self.compute_instance,
            "nvmlComputeInstanceDestroy": self.destroy_ci,
            "nvmlGpuInstanceDestroy": self.destroy_gi,
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
        if not handle.mig and not handle.mig_capable:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        on = bool(handle.mig) or handle.mig_mode_on
        pending_on = on if handle.pending_on is None else handle.pending_on
        return (pynvml.NVML_DEVICE_MIG_ENABLE if on else pynvml.NVML_DEVICE_MIG_DISABLE,
                pynvml.NVML_DEVICE_MIG_ENABLE if pending_on else pynvml.NVML_DEVICE_MIG_DISABLE)

    def set_mig_mode(self, handle: Gpu, mode: int) -> int:
        """The activation status, as `nvmlDeviceSetMigMode` returns it."""
        if not handle.mig_capable:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        on = mode == pynvml.NVML_DEVICE_MIG_ENABLE
        if not on and (handle.mig or handle.gis):
            raise err(pynvml.NVML_ERROR_IN_USE)
        if handle.reset_needed:
            handle.pending_on = None if on == handle.mig_mode_on else on
            return pynvml.NVML_ERROR_RESET_REQUIRED
        handle.mig_mode_on, handle.pending_on = on, None
        return pynvml.NVML_SUCCESS

    @staticmethod
    def reset(gpu: Gpu) -> None:
        """The operator's GPU reset (`nvidia-smi -r`): a pending MIG mode takes effect."""
        if gpu.pending_on is not None:
            gpu.mig_mode_on, gpu.pending_on = gpu.pending_on, None

    def profile_info(self, handle: Gpu, profile_id: int) -> Any:
        if not handle.mig_capable or profile_id not in PROFILES_80GB:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _, slices, memory, _ = PROFILES_80GB[profile_id]
        return SimpleNamespace(id=profile_id, sliceCount=slices, memorySizeMB=memory)

    def placements(self, handle: Gpu, profile_id: int) -> list[Any]:
        size = PROFILES_80GB[profile_id][3]
        return [SimpleNamespace(start=s, size=size) for s in range(0, 8, size)]

    def taken(self, gpu: Gpu) -> set[int]:
        slots = {s for _, g, mb, start in gpu.mig
                 for s in range(start, start + memory_slices(g, mb))}
        return slots | {s for gi in gpu.gis
                        for s in range(gi.start, gi.start + PROFILES_80GB[gi.profile_id][3])}

    def create_gi(self, handle: Gpu, profile_id: int, placement: Any) -> Gi:
        if not self.mig_mode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        size = PROFILES_80GB[profile_id][3]
        wanted = set(range(placement.start, placement.start + placement.size))
        if placement.size != size or placement.start % size or wanted & self.taken(handle):
            raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        self.next_gi += 1
        gi = Gi(handle, self.next_gi, profile_id, placement.start)
        handle.gis.append(gi)
        return gi

    def create_ci(self, gi: Gi, ci_profile: int) -> Any:
        gpu = gi.parent
        if gpu.ci_error is not None:
            code, gpu.ci_error = gpu.ci_error, None
            raise err(code)
        _, slices, memory, _ = PROFILES_80GB[gi.profile_id]
        uuid = f"MIG-sim-{gpu.uuid}-{len(self.created)}"
        self.created.append(uuid)
        gpu.gis.remove(gi)
        gpu.mig.append((uuid, slices, memory, gi.start))
        return SimpleNamespace(uuid=uuid)

    def gpu_instance(self, handle: Gpu, key: Any) -> Any:
        if isinstance(key, Mig):
            return key
        if isinstance(key, int) and key < len(handle.mig):
            return self.mig_handle(handle, key)
        for gi in handle.gis:
            if gi.gid == key:
                return gi
        raise err(pynvml.NVML_ERROR_NOT_FOUND)

    def compute_instance(self, gi: Any, ci_id: int) -> Any:
        if isinstance(gi, Mig) and ci_id == 0:
            return gi
        raise err(pynvml.NVML_ERROR_NOT_FOUND)

    def destroy_ci(self, ci: Mig) -> None:
        if ci.processes:
            raise err(pynvml.NVML_ERROR_IN_USE)
        ci.parent.mig[:] = [m for m in ci.parent.mig if m[0] != ci.uuid]

    def destroy_gi(self, gi: Any) -> None:
        if isinstance(gi, Gi):
            gi.parent.gis.remove(gi)
        elif any(m[0] == gi.uuid for m in gi.parent.mig):
            raise err(pynvml.NVML_ERROR_IN_USE)

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
