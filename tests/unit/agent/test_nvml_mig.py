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
from elastic_gpu.core.mig.apply import Create, Destroy, Placed, SetMigMode, placed_of
from elastic_gpu.core.model import MigMode
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


def test_mig_mode_off_applies_at_once_where_the_driver_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig_mode_on = True  # in MIG mode with no instance left
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    card = backend.discover()[0]
    assert card.mig == () and card.mig_enabled  # backs no whole card while in MIG mode
    assert card.mig_mode == MigMode(current=True, pending=True)
    backend.apply_mig_step(gpus[0].uuid, SetMigMode(False))
    card = backend.discover()[0]
    assert card.mig_mode == MigMode(current=False, pending=False) and not card.mig_enabled


def test_mig_mode_off_pending_a_reset_is_read_back_as_pending_until_the_reset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig_mode_on = gpus[0].reset_needed = True
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    backend.apply_mig_step(gpus[0].uuid, SetMigMode(False))  # activation: RESET_REQUIRED
    card = backend.discover()[0]
    assert card.mig_mode == MigMode(current=True, pending=False) and card.mig_enabled
    assert card.mig_mode.waits_for_reset
    SimNvml.reset(gpus[0])  # never the agent: the operator's nvidia-smi -r
    assert backend.discover()[0].mig_mode == MigMode(current=False, pending=False)


def test_mig_mode_off_is_refused_while_instances_stand(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[1].mig = [("MIG-b", 3, 40192, 0)]
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    with pytest.raises(BackendError, match="MIG mode off"):
        backend.apply_mig_step(gpus[1].uuid, SetMigMode(False))
    assert backend.discover()[1].mig_mode == MigMode(current=True, pending=True)
