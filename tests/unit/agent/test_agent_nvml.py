"""The NVML backend against nvidia-ml-py with its functions replaced: devices and faults."""

from __future__ import annotations

import pynvml
import pytest

from egpu_testing.clock import ManualClock
from egpu_testing.scripted_nvml import Gpu, SimNvml, two_gpus
from elastic_gpu.agent.backends.base import BackendError
from elastic_gpu.agent.backends.nvml import NvmlBackend, mig_profile_name
from elastic_gpu.agent.config import HealthConfig
from elastic_gpu.core.model import Health, LinkKind


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
    clock = ManualClock()
    backend = NvmlBackend(HealthConfig(recoverAfterSeconds=60), clock=clock)
    backend.discover()
    sim.xid(gpus[0], 48)
    assert [e.health for e in backend.wait_health(0.01)] == [Health.UNHEALTHY]
    gpus[0].lost = False
    clock.advance(59)  # answers again, but not yet asked
    assert backend.wait_health(0.01) == []
    gpus[0].lost = True  # still sick after the delay: stays unhealthy
    clock.advance(1)
    assert backend.wait_health(0.01) == []
    gpus[0].lost = False
    clock.advance(59)  # looked at the sick card a minute ago: the next look is 60 s after that
    assert backend.wait_health(0.01) == []
    clock.advance(1)
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
