"""NVML's side of applying a MIG layout (agent/backends/nvml_mig.py) over the scripted NVML:
what only a driver does (mode changes waiting for a reset, a compute instance that fails, a
device in use, a GPU instance left behind by a killed agent). The contract every backend keeps
is in test_backend_conformance.py."""

from __future__ import annotations

import pynvml
import pytest

from egpu_testing.scripted_nvml import Gi, SimNvml, two_gpus
from elastic_gpu.agent.backends.base import BackendError
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.core.mig.apply import Create, Destroy, Placed, placed_of
from elastic_gpu.core.resources import MigProfile


def _placed(name: str, start: int) -> Placed:
    return Placed(start, MigProfile.parse(name))


def test_mig_mode_is_enabled_for_the_first_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    backend.apply_mig_step(gpus[0].uuid, Create(_placed("7g.80gb", 0)))
    assert gpus[0].mig_mode_on and [m[1:] for m in gpus[0].mig] == [(7, 81152, 0)]


def test_a_mode_change_waiting_for_a_reset_is_reported_and_nothing_is_carved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].reset_needed = True
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    with pytest.raises(BackendError, match="pending a GPU reset"):
        backend.apply_mig_step(gpus[0].uuid, Create(_placed("3g.40gb", 0)))
    assert gpus[0].mig == [] and gpus[0].gis == []


def test_a_failed_compute_instance_leaves_no_gpu_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].ci_error = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    with pytest.raises(BackendError, match=r"compute instance of 3g\.40gb@0"):
        backend.apply_mig_step(gpus[0].uuid, Create(_placed("3g.40gb", 0)))
    assert gpus[0].gis == [] and gpus[0].mig == []


def test_a_gpu_instance_left_by_a_killed_agent_is_removed_before_the_next_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig_mode_on = True
    gpus[0].gis.append(Gi(gpus[0], 16, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 0))
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    card = backend.discover()[0]
    assert card.mig == ()  # invisible to discovery and to the step function ...
    after = backend.apply_mig_step(gpus[0].uuid, Create(_placed("3g.40gb", 0)))
    # ... yet its slices were taken: it is destroyed first, and the step succeeds
    assert [str(p) for p in placed_of(after)] == ["3g.40gb@0"] and gpus[0].gis == []


def test_a_device_in_use_is_never_destroyed(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[1].mig = [("MIG-busy", 3, 40192, 0)]
    gpus[1].mig_processes = {"MIG-busy": [(4242, 1024)]}
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    busy = backend.discover()[1].mig[0]
    with pytest.raises(BackendError, match="MIG-busy"):
        backend.apply_mig_step(gpus[1].uuid, Destroy(busy))
    assert [m[0] for m in gpus[1].mig] == ["MIG-busy"]
