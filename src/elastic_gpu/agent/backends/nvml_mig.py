"""Carving MIG instances through NVML: one step of `core.mig.apply` on one card.

`create(handle, placed)`: MIG mode on (`nvmlDeviceSetMigMode`; when the driver says the change
waits for a GPU reset, a `BackendError` says so and nothing else is done), GPU instance of the
profile at the placement (`nvmlDeviceCreateGpuInstanceWithPlacement`), then one compute
instance spanning it (`nvmlGpuInstanceCreateComputeInstance`, the profile of its slice count),
which is what makes it a MIG device kubelet's device plugin and the discovery see. A compute
instance that cannot be made destroys its GPU instance again.

`set_mode(handle, on)`: MIG mode on or off (`nvmlDeviceSetMigMode`), as the step function asks
it (on before a card's first instance, off after a merged-back card's last one). The driver may
apply it at once (an idle Hopper) or keep it pending a GPU reset (an A100 or A30, a device not
idle: its activation status says `RESET_REQUIRED` or `IN_USE`); the mode read back
(`nvmlDeviceGetMigMode`: current and pending) tells which, and the step function then reports
`PendingReset` until the operator has reset the GPU. The agent never resets a GPU itself.

`destroy(handle, uuid)`: the compute instances of the MIG device, then its GPU instance; a
device with processes is refused by the driver (`In Use`), which is reported, never forced.

Crash safety: an agent killed between the GPU and the compute instance leaves a GPU instance
with no compute instance: no MIG device, so neither discovery nor the step function sees it, yet
its slices are taken. `remove_orphans(handle)` destroys such GPU instances before every step
(they are never anyone's: a pod is given MIG devices, which need a compute instance).

GPU and compute instances are enumerated by id (`nvmlDeviceGetGpuInstanceById`, ids below
`MAX_INSTANCE_ID`) rather than with the `nvmlDeviceGetGpuInstances` array call. This module is
never run on a real GPU in this project's tests; `egpu_testing.scripted_nvml` scripts it.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

from elastic_gpu.agent.backends.base import BackendError
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.model import MigMode
from elastic_gpu.core.resources import MigProfile

log = logging.getLogger(__name__)

#: GPU and compute instance ids NVML hands out are small (at most one per memory slice per
#: profile); ids are tried below this.
MAX_INSTANCE_ID = 32


def _fail(what: str, err: pynvml.NVMLError) -> BackendError:
    return BackendError(f"{what}: {err}")


def _profile_name(info: Any, profile_id: int) -> MigProfile:
    slices, memory_mib = int(info.sliceCount), int(info.memorySizeMB)
    name = MigProfile(slices, max(1, -(-memory_mib // 1024)))
    if profile_id == getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", -1):
        return MigProfile(name.slices, name.memory_gb, "+me")
    return name


def gpu_instance_profile(handle: Any, profile: MigProfile) -> Any:
    """NVML's GPU instance profile info of `profile` on the card; BackendError if none."""
    for profile_id in range(int(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
        except pynvml.NVMLError:
            continue  # not a profile of this card
        if _profile_name(info, profile_id) == profile:
            return info
    raise BackendError(f"the card has no GPU instance profile {profile.name}")


def read_mode(handle: Any) -> MigMode | None:
    """The card's MIG mode (current, pending); None where it has none (NotSupported)."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return None
    return MigMode(current == pynvml.NVML_DEVICE_MIG_ENABLE,
                   pending == pynvml.NVML_DEVICE_MIG_ENABLE)


def set_mode(handle: Any, on: bool) -> MigMode:
    """Ask for MIG mode `on`/off; the mode after it (module doc). A BackendError when the
    driver refuses it, or neither applies nor keeps it pending."""
    wanted = pynvml.NVML_DEVICE_MIG_ENABLE if on else pynvml.NVML_DEVICE_MIG_DISABLE
    try:
        status = pynvml.nvmlDeviceSetMigMode(handle, wanted)
    except pynvml.NVMLError as err:
        raise _fail(f"setting MIG mode {'on' if on else 'off'}", err) from None
    mode = read_mode(handle)
    if mode is None or on not in (mode.current, mode.pending):
        raise BackendError(f"MIG mode {'on' if on else 'off'} was not taken (activation status "
                           f"{status}, mode now {mode})")
    if mode.current != on:
        log.warning("MIG mode %s is pending a GPU reset (activation status %s)",
                    "on" if on else "off", status)
    return mode


def ensure_mig_mode(handle: Any) -> None:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        if current == pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as err:
        raise _fail("enabling MIG mode", err) from None
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        raise BackendError("MIG mode is enabled but pending a GPU reset (the driver applies it "
                           f"only after one; pending={pending}); the card is left as it is")


def create(handle: Any, placed: Placed) -> None:
    """Carve `placed` (GPU instance and one compute instance spanning it)."""
    ensure_mig_mode(handle)
    info = gpu_instance_profile(handle, placed.profile)
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start = placed.start
    placement.size = _memory_slices(handle, info)
    try:
        gpu_instance = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
    except pynvml.NVMLError as err:
        raise _fail(f"creating GPU instance {placed}", err) from None
    try:
        ci_profile = getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{int(info.sliceCount)}_SLICE")
        ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gpu_instance, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        pynvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
    except (pynvml.NVMLError, AttributeError) as err:
        try:
            pynvml.nvmlGpuInstanceDestroy(gpu_instance)
        except pynvml.NVMLError as undo:
            log.error("GPU instance %s left without a compute instance: %s", placed, undo)
        raise BackendError(f"creating the compute instance of {placed}: {err}") from None


def _memory_slices(handle: Any, info: Any) -> int:
    """The placement size: the profile's memory slices (its memory over the card's 1/8, A30:
    1/4; NVML reports a profile's possible placements with it, which a scripted NVML has too)."""
    try:
        return int(pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id)[0].size)
    except (pynvml.NVMLError, IndexError, TypeError, AttributeError):
        return int(info.sliceCount)


def destroy(handle: Any, uuid: str) -> None:
    """Destroy the MIG device `uuid` (its compute instances, then its GPU instance)."""
    device = _mig_device(handle, uuid)
    try:
        gi_id = pynvml.nvmlDeviceGetGpuInstanceId(device)
        ci_id = pynvml.nvmlDeviceGetComputeInstanceId(device)
        gpu_instance = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        compute = pynvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
        pynvml.nvmlComputeInstanceDestroy(compute)
        pynvml.nvmlGpuInstanceDestroy(gpu_instance)
    except pynvml.NVMLError as err:
        raise _fail(f"destroying MIG device {uuid}", err) from None


def _mig_device(handle: Any, uuid: str) -> Any:
    for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            found = pynvml.nvmlDeviceGetUUID(device)
        except pynvml.NVMLError:
            continue
        if (found.decode() if isinstance(found, bytes) else str(found)) == uuid:
            return device
    raise BackendError(f"no MIG device {uuid} on the card")


def remove_orphans(handle: Any) -> int:
    """Destroy GPU instances with no compute instance (module doc); how many went."""
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return 0
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return 0
    removed = 0
    for gi_id in range(MAX_INSTANCE_ID):
        try:
            gpu_instance = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        except pynvml.NVMLError:
            continue
        if any(_has_compute(gpu_instance, ci_id) for ci_id in range(MAX_INSTANCE_ID)):
            continue
        try:
            pynvml.nvmlGpuInstanceDestroy(gpu_instance)
            removed += 1
            log.warning("destroyed GPU instance %d, which had no compute instance (a step "
                        "interrupted between the two)", gi_id)
        except pynvml.NVMLError as err:
            raise _fail(f"destroying the orphan GPU instance {gi_id}", err) from None
    return removed


def _has_compute(gpu_instance: Any, ci_id: int) -> bool:
    try:
        pynvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
    except pynvml.NVMLError:
        return False
    return True
