"""The NVIDIA backend, through NVML (nvidia-ml-py, module `pynvml`).

Discovery: index, UUID, model name, memory, minor number (for /dev/nvidiaN), NUMA node,
NVLink lanes between cards (by the remote end's PCI bus id) and, where there is none, the PCIe
topology's common ancestor; MIG instances with their profile and placement.

Health: an NVML event set with critical-XID and double-bit-ECC events, as NVIDIA's own device
plugin does. XIDs caused by applications (13 graphics engine exception, 31 MMU fault,
43 channel stopped, 45 preemptive cleanup, 68 video processor exception, 109 context switch
timeout; configurable) do not mark a card unhealthy. A card is healthy again when
`recoverAfterSeconds` passed since its last critical event and the driver answers for it
again (NVIDIA's plugin never recovers; we do, because a card reset or a cleared ECC error
otherwise needs an agent restart to be used again).

Isolation: CUDA MPS in `mps` sharing mode (`backends.isolation.CudaMps`).

Every pynvml call goes through the module attribute (`pynvml.nvmlX(...)`), so tests inject
faults by monkeypatching the module's functions.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from elastic_gpu.agent.backends.base import (
    BackendError,
    CardSample,
    HealthEvent,
    Holder,
    MigSample,
    ProcessSample,
)
from elastic_gpu.agent.backends.isolation import Isolation, cuda_mps_isolation
from elastic_gpu.agent.config import HealthConfig, SharingConfig
from elastic_gpu.core.mig.apply import CardChange, Create, Destroy, Placed
from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance
from elastic_gpu.core.resources import MigProfile

log = logging.getLogger(__name__)

MIB = 1 << 20
CRITICAL_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
_NO_INSTANCE = 0xFFFFFFFF

_TOPOLOGY_KIND = {
    pynvml.NVML_TOPOLOGY_INTERNAL: LinkKind.SAME_BOARD,
    pynvml.NVML_TOPOLOGY_SINGLE: LinkKind.PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: LinkKind.PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: LinkKind.NUMA,
    pynvml.NVML_TOPOLOGY_NODE: LinkKind.NUMA,
    pynvml.NVML_TOPOLOGY_SYSTEM: LinkKind.SYSTEM,
}


def explain(err: Exception) -> str:
    """A message a node operator can act on."""
    if isinstance(err, pynvml.NVMLError_LibraryNotFound):
        return ("NVML library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed and "
                "is the agent run with the NVIDIA container runtime?")
    if isinstance(err, pynvml.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded (nvidia.ko): no GPU can be served on this node"
    if isinstance(err, pynvml.NVMLError_NoPermission):
        return "no permission to talk to the NVIDIA driver: run the agent privileged"
    return f"NVML error: {err}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str:
    """PCI bus ids come as 00000000:3B:00.0 or 0000:3b:00.0; compare on the last 12 chars."""
    return _text(value).lower()[-12:]


def _process_memory(running: Any) -> dict[int, int]:
    """pid -> MiB from NVML's compute process list (a pid listed twice is summed)."""
    memory: dict[int, int] = {}
    for proc in running:
        # usedGpuMemory is None where the driver cannot say (Windows WDDM, some MIG).
        taken = getattr(proc, "usedGpuMemory", None)
        pid = int(proc.pid)
        memory[pid] = memory.get(pid, 0) + (int(taken) // MIB if taken else 0)
    return memory


def mig_profile_name(slices: int, memory_mib: int) -> MigProfile:
    """NVIDIA names a profile by slices and memory rounded up to whole GB (1g.10gb: 9856 MiB)."""
    return MigProfile(slices, max(1, math.ceil(memory_mib / 1024)))


class NvmlBackend:
    """Physical NVIDIA GPUs of this machine."""

    def __init__(self, health: HealthConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._health_cfg = health or HealthConfig()
        #: when a card turned unhealthy and when to look again (`recoverAfterSeconds`)
        self._clock = clock
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise BackendError(explain(err)) from None
        self._handles: dict[str, Any] = {}
        self._minor: dict[int, int] = {}
        self._event_set: Any = None
        self._unhealthy_since: dict[str, float] = {}
        self._pending: list[HealthEvent] = []
        #: Per card, the newest process-utilisation sample seen (NVML returns those after it).
        self._last_seen: dict[str, int] = {}
        #: Cards carved into MIG instances at discovery (sampled per instance too).
        self._mig_cards: dict[str, bool] = {}
        self._index: dict[str, int] = {}

    @property
    def name(self) -> str:
        return "nvml"

    @property
    def visible_devices_env(self) -> str:
        return "NVIDIA_VISIBLE_DEVICES"

    # -- discovery ---------------------------------------------------------------------------

    def discover(self) -> tuple[Card, ...]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise BackendError(explain(err)) from None
        found: list[tuple[int, Any, Card, str]] = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                card = self._card(index, handle)
                bus = _bus(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            except pynvml.NVMLError as err:
                # A card we cannot even describe cannot be served: leave it out rather than
                # advertise it (kubelet would hand it to a pod that then fails).
                log.error("GPU %d left out: %s", index, explain(err))
                continue
            found.append((index, handle, card, bus))
        by_bus = {bus: index for index, _, _, bus in found}
        cards = []
        for index, handle, card, _ in found:
            links = self._links(index, handle, by_bus, found)
            cards.append(Card(card.index, card.uuid, card.model, card.memory_mib,
                              links=links, mig=card.mig, numa_node=card.numa_node,
                              health=self._current_health(card.uuid), mig_mode=card.mig_mode))
            self._handles[card.uuid] = handle
            self._index[card.uuid] = index
            self._mig_cards[card.uuid] = bool(card.mig)
        return tuple(cards)

    def _current_health(self, uuid: str) -> Health:
        return Health.UNHEALTHY if uuid in self._unhealthy_since else Health.HEALTHY

    def _card(self, index: int, handle: Any) -> Card:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        model = _text(pynvml.nvmlDeviceGetName(handle))
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        self._minor[index] = int(pynvml.nvmlDeviceGetMinorNumber(handle))
        numa: int | None
        try:
            numa = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
            numa = numa if numa >= 0 else None
        except (pynvml.NVMLError, AttributeError):
            numa = None
        from elastic_gpu.agent.backends import nvml_mig

        return Card(index, uuid, model, memory, mig=self._mig(index, handle), numa_node=numa,
                    mig_mode=nvml_mig.read_mode(handle))

    def _mig(self, index: int, handle: Any) -> tuple[MigInstance, ...]:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError:
            return ()  # NotSupported: not a MIG-capable card
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        instances = []
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue
            attrs = pynvml.nvmlDeviceGetAttributes(mig)
            profile = mig_profile_name(int(attrs.gpuInstanceSliceCount), int(attrs.memorySizeMB))
            start = 0
            try:
                gi_id = pynvml.nvmlDeviceGetGpuInstanceId(mig)
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                start = int(pynvml.nvmlGpuInstanceGetInfo(gi).placement.start)
            except pynvml.NVMLError as err:
                log.warning("GPU %d MIG slot %d: placement unknown (%s)", index, slot, err)
            instances.append(MigInstance(profile, _text(pynvml.nvmlDeviceGetUUID(mig)), start))
        return tuple(instances)

    def _links(self, index: int, handle: Any, by_bus: dict[str, int],
               found: list[tuple[int, Any, Card, str]]) -> tuple[Link, ...]:
        lanes: dict[int, int] = {}
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except pynvml.NVMLError:
                break  # NotSupported / InvalidArgument: no (more) NVLinks on this card
            peer = by_bus.get(remote)
            if peer is not None and peer != index:
                lanes[peer] = lanes.get(peer, 0) + 1
        links = [Link(peer, LinkKind.NVLINK, count) for peer, count in sorted(lanes.items())]
        for peer, peer_handle, _, _ in found:
            if peer == index or peer in lanes:
                continue
            try:
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, peer_handle)
            except pynvml.NVMLError:
                continue
            kind = _TOPOLOGY_KIND.get(int(level))
            if kind is not None:
                links.append(Link(peer, kind))
        return tuple(links)

    # -- health ------------------------------------------------------------------------------

    def _register_events(self) -> None:
        self._event_set = pynvml.nvmlEventSetCreate()
        for uuid, handle in self._handles.items():
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, CRITICAL_EVENTS, self._event_set)
            except pynvml.NVMLError_NotSupported:
                log.warning("GPU %s does not report health events; it stays healthy", uuid)
            except pynvml.NVMLError as err:
                self._mark(uuid, Health.UNHEALTHY, f"cannot watch health: {explain(err)}")

    def _mark(self, uuid: str, health: Health, reason: str) -> None:
        was_unhealthy = uuid in self._unhealthy_since
        if health is Health.UNHEALTHY:
            self._unhealthy_since[uuid] = self._clock()
            if not was_unhealthy:
                self._pending.append(HealthEvent(uuid, health, reason))
        elif was_unhealthy:
            del self._unhealthy_since[uuid]
            self._pending.append(HealthEvent(uuid, health, reason))

    def wait_health(self, timeout_s: float) -> list[HealthEvent]:
        if self._event_set is None:
            if not self._handles:
                self.discover()
            self._register_events()
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, max(1, int(timeout_s * 1000)))
        except pynvml.NVMLError_Timeout:
            data = None
        except pynvml.NVMLError as err:
            # NVIDIA's plugin does the same: an event wait that fails says nothing about which
            # card is sick, so none can be trusted until they answer again.
            for uuid in self._handles:
                self._mark(uuid, Health.UNHEALTHY, f"health check failed: {explain(err)}")
            data = None
        if data is not None:
            self._on_event(data)
        self._recover()
        events, self._pending = self._pending, []
        return events

    def _on_event(self, data: Any) -> None:
        kind = int(data.eventType)
        code = int(data.eventData)
        if kind == pynvml.nvmlEventTypeXidCriticalError:
            if code in self._health_cfg.ignoredXids:
                log.info("XID %d is an application error; card stays healthy", code)
                return
            reason = f"XID {code}"
        elif kind == pynvml.nvmlEventTypeDoubleBitEccError:
            reason = "double-bit ECC error"
        else:
            return
        if int(data.gpuInstanceId) != _NO_INSTANCE:
            reason += f" (MIG GPU instance {int(data.gpuInstanceId)})"
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as err:
            for each in self._handles:
                self._mark(each, Health.UNHEALTHY, f"{reason} on an unknown GPU ({explain(err)})")
            return
        if uuid in self._handles:
            self._mark(uuid, Health.UNHEALTHY, reason)

    def _recover(self) -> None:
        after = self._health_cfg.recoverAfterSeconds
        if after <= 0:
            return
        now = self._clock()
        for uuid, since in list(self._unhealthy_since.items()):
            if now - since < after:
                continue
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError:
                self._unhealthy_since[uuid] = now  # still sick: look again `after` from now
                continue
            self._mark(uuid, Health.HEALTHY, f"driver answers again {after:.0f}s after the error")

    # -- usage -------------------------------------------------------------------------------

    def sample(self, holders: Sequence[Holder] = ()) -> tuple[CardSample, ...]:
        """Per card: memory used (nvmlDeviceGetMemoryInfo), SM utilisation
        (nvmlDeviceGetUtilizationRates), the compute processes with their memory
        (nvmlDeviceGetComputeRunningProcesses; on a MIG card the parent lists every
        instance's) and each one's SM share since the last sample
        (nvmlDeviceGetProcessUtilization, where the card has it: not in MIG mode). `holders`
        are ignored: the hardware says who uses it."""
        if not self._handles:
            self.discover()
        out = []
        for uuid, handle in self._handles.items():
            try:
                used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
                util = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError as err:
                log.warning("GPU %s not sampled: %s", uuid, explain(err))
                continue
            sm = self._process_sm(uuid, handle)
            memory = _process_memory(running)
            out.append(CardSample(uuid, used, max(0, min(100, util)),
                                  tuple(ProcessSample(pid, mib, sm.get(pid))
                                        for pid, mib in sorted(memory.items())),
                                  self._mig_samples(uuid, handle)))
        if self._handles and not out:
            raise BackendError("no GPU of this node could be sampled")
        return tuple(out)

    def _mig_samples(self, uuid: str, handle: Any) -> tuple[MigSample, ...]:
        """Each MIG instance's memory in use and compute processes, from its MIG device handle
        (`nvmlDeviceGetMemoryInfo`, `nvmlDeviceGetComputeRunningProcesses`); NVML gives no
        utilisation per instance. None on a card without MIG; an instance that does not
        answer is left out."""
        if not self._mig_cards.get(uuid):
            return ()
        out = []
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError:
                continue  # an empty slot
            try:
                mig_uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
                used = int(pynvml.nvmlDeviceGetMemoryInfo(mig).used) // MIB
                memory = _process_memory(pynvml.nvmlDeviceGetComputeRunningProcesses(mig))
            except pynvml.NVMLError as err:
                log.warning("MIG instance %d of %s not sampled: %s", slot, uuid, explain(err))
                continue
            out.append(MigSample(mig_uuid, used, tuple(ProcessSample(pid, mib)
                                                       for pid, mib in sorted(memory.items()))))
        return tuple(out)

    def _process_sm(self, uuid: str, handle: Any) -> dict[int, int]:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(uuid, 0))
        except (pynvml.NVMLError, AttributeError):
            return {}  # NotFound: no sample since the last; NotSupported: MIG, old cards
        newest: dict[int, tuple[int, int]] = {}
        for item in samples:
            stamp, pid = int(item.timeStamp), int(item.pid)
            if pid not in newest or stamp > newest[pid][0]:
                newest[pid] = (stamp, max(0, min(100, int(item.smUtil))))
        if newest:
            self._last_seen[uuid] = max(stamp for stamp, _ in newest.values())
        return {pid: sm for pid, (_, sm) in newest.items()}

    # -- MIG layout ------------------------------------------------------------------------

    def apply_mig_step(self, card_uuid: str, step: CardChange) -> tuple[MigInstance, ...]:
        from elastic_gpu.agent.backends import nvml_mig

        handle = self._handles.get(card_uuid)
        if handle is None:
            raise BackendError(f"no card {card_uuid} was discovered on this node")
        nvml_mig.remove_orphans(handle)
        if isinstance(step, Create):
            nvml_mig.create(handle, step.placed)
        elif isinstance(step, Destroy):
            nvml_mig.destroy(handle, step.instance.uuid)
        else:
            nvml_mig.set_mode(handle, step.on)
        instances = self._mig(self._index.get(card_uuid, -1), handle)
        self._mig_cards[card_uuid] = bool(instances)
        return instances

    # -- for `egpu gpu-check` (agent/gpucheck.py) ----------------------------------------

    def mig_enabled(self, card_uuid: str) -> bool | None:
        """Whether the card's current MIG mode is on; None where it has no MIG (NotSupported)."""
        handle = self._handles.get(card_uuid)
        if handle is None:
            raise BackendError(f"no card {card_uuid} was discovered on this node")
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError:
            return None
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def create_mig_instance(self, card_uuid: str, placed: Placed) -> tuple[MigInstance, ...]:
        """One instance carved on a card whose MIG mode is already on (refused otherwise: the
        mode is never changed here), with no orphan cleanup: the operator's card is touched
        only by this instance. The card's instances after it."""
        if not self.mig_enabled(card_uuid):
            raise BackendError(f"MIG mode is not on for {card_uuid}; it is left as it is")
        from elastic_gpu.agent.backends import nvml_mig

        nvml_mig.create(self._handles[card_uuid], placed)
        return self._mig(self._index.get(card_uuid, -1), self._handles[card_uuid])

    def destroy_mig_instance(self, card_uuid: str, mig_uuid: str) -> tuple[MigInstance, ...]:
        from elastic_gpu.agent.backends import nvml_mig

        handle = self._handles.get(card_uuid)
        if handle is None:
            raise BackendError(f"no card {card_uuid} was discovered on this node")
        nvml_mig.destroy(handle, mig_uuid)
        return self._mig(self._index.get(card_uuid, -1), handle)

    # -- devices ---------------------------------------------------------------------------

    def device_nodes(self, card: Card) -> tuple[str, ...]:
        minor = self._minor.get(card.index)
        return () if minor is None else (f"/dev/nvidia{minor}",)

    def control_nodes(self) -> tuple[str, ...]:
        return ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

    def isolation(self, sharing: SharingConfig) -> Isolation | None:
        return cuda_mps_isolation(sharing)

    def close(self) -> None:
        try:
            if self._event_set is not None:
                pynvml.nvmlEventSetFree(self._event_set)
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("NVML shutdown: %s", err)
