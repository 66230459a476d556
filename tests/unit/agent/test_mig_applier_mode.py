"""The agent's MIG applier and the card's MIG mode, over the in-memory API and the NVML backend
on the scripted NVML (issue 42): a merged-back card has its mode turned off after its last
instance; where the driver keeps that pending a GPU reset, the MigLayout says so
(`PendingReset`), the card stays fenced and backs no whole card, until the operator's reset,
after which it is published as a whole card and unfenced. Carving a card in MIG mode off turns
the mode on first, under the same rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from egpu_testing.clock import ManualClock
from egpu_testing.memory_api import MemoryApi
from egpu_testing.scripted_nvml import Gpu, SimNvml, two_gpus
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.publish import publish_node
from elastic_gpu.agent.miglayout import MigApplier
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core.mig.apply import FENCE_SETTLE_S, Placed
from elastic_gpu.core.model import Card, Health, MigMode
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.resources import GPUDEVICES, MIG_LAYOUTS, NODES

NODE = "nvml-000"
P3 = MigProfile.parse("3g.40gb")
CONFIG = parse_config({"migStrategy": "mixed"})
HOST = {"cpu": "16", "memory": "64Gi", "pods": "110"}


def setup(monkeypatch: pytest.MonkeyPatch, clock: ManualClock, gpus: list[Gpu]
          ) -> tuple[MemoryApi, MigApplier]:
    SimNvml(monkeypatch, gpus)
    api = MemoryApi()
    api.add(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                           "status": {"capacity": dict(HOST), "allocatable": dict(HOST)}})
    backend = NvmlBackend()
    publish_node(api, backend, CONFIG, NODE)  # type: ignore[arg-type]
    applier = MigApplier(api, NODE, backend,  # type: ignore[arg-type]
                         lambda: publish_node(api, backend, CONFIG, NODE),  # type: ignore[arg-type]
                         clock=clock)
    return api, applier


def carved() -> list[Gpu]:
    """Two A100-80GB cards, the first carved with one 3g.40gb instance."""
    gpus = two_gpus()
    gpus[0].mig = [("MIG-a-1", 3, 40192, 0)]
    return gpus


def want(api: MemoryApi, card: str, *placed: Placed) -> None:
    body = ml.layout_spec(NODE, card, placed)
    body["metadata"]["generation"] = 1
    api.create(MIG_LAYOUTS.path(), body)


def status(api: MemoryApi, card: str) -> dict[str, Any]:
    return dict(api.get(MIG_LAYOUTS.path(name=ml.object_name(NODE, card)))["status"])


def device(api: MemoryApi, index: int) -> Card:
    return gd.card_from_object(api.get(GPUDEVICES.path(name=gd.object_name(NODE, index))))[1]


def gpus_offered(api: MemoryApi) -> str:
    return str(api.get(NODES.path(name=NODE))["status"]["allocatable"].get("nvidia.com/gpu", "0"))


def test_a_merge_back_turns_mig_mode_off_at_once_where_the_card_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    gpus = carved()
    api, applier = setup(monkeypatch, clock, gpus)
    assert gpus_offered(api) == "1"  # the carved card backs no whole card
    want(api, "GPU-aaaa")  # merge back: the whole card
    assert applier.round() == {"GPU-aaaa": "Fencing"}
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {"GPU-aaaa": "Applied"}
    assert gpus[0].mig == [] and not gpus[0].mig_mode_on  # instance gone, then the mode
    assert device(api, 0).health is Health.HEALTHY and gpus_offered(api) == "2"
    assert status(api, "GPU-aaaa")["phase"] == "Applied"


def test_a_mode_off_pending_a_reset_keeps_the_card_fenced_until_the_operator_resets_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    gpus = carved()
    gpus[0].reset_needed = True  # an A100 the driver cannot switch without a reset
    api, applier = setup(monkeypatch, clock, gpus)
    want(api, "GPU-aaaa")
    applier.round()
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {"GPU-aaaa": "PendingReset"}
    assert gpus[0].mig == [] and gpus[0].mig_mode_on and gpus[0].pending_on is False
    got = status(api, "GPU-aaaa")
    assert got["phase"] == "PendingReset"
    assert got["reason"] == ("MIG mode off is pending a GPU reset; the operator resets the GPU "
                             "(nvidia-smi -r) when idle")
    # still in MIG mode: fenced, and no whole card is offered (nor any instance)
    assert device(api, 0).health is Health.FENCED and gpus_offered(api) == "1"
    assert device(api, 0).mig_mode == MigMode(current=True, pending=False)  # the GPUDevice's
    assert "nvidia.com/mig-3g.40gb" not in api.get(NODES.path(name=NODE))["status"]["allocatable"]
    clock.advance(60)
    assert applier.round() == {"GPU-aaaa": "PendingReset"}  # each round reads the mode again
    assert device(api, 0).health is Health.FENCED
    SimNvml.reset(gpus[0])  # the operator: nvidia-smi -r
    assert applier.round() == {"GPU-aaaa": "Applied"}
    assert not gpus[0].mig_mode_on
    assert device(api, 0).health is Health.HEALTHY and gpus_offered(api) == "2"
    assert device(api, 0).mig_mode == MigMode(current=False, pending=False)
    assert status(api, "GPU-aaaa")["phase"] == "Applied"


def test_carving_a_card_in_mig_mode_off_turns_it_on_first_under_the_same_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    gpus = two_gpus()
    gpus[1].reset_needed = True
    api, applier = setup(monkeypatch, clock, gpus)
    want(api, "GPU-bbbb", Placed(4, P3))
    applier.round()
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {"GPU-bbbb": "PendingReset"}
    assert status(api, "GPU-bbbb")["reason"].startswith("MIG mode on is pending a GPU reset")
    assert gpus[1].mig == [] and gpus[1].pending_on is True
    assert device(api, 1).health is Health.FENCED
    SimNvml.reset(gpus[1])
    assert applier.round() == {"GPU-bbbb": "Applied"}
    assert [m[1:] for m in gpus[1].mig] == [(3, 40192, 4)]
    assert device(api, 1).health is Health.HEALTHY
    assert api.get(NODES.path(name=NODE))["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "1"


def test_a_pending_reset_tells_the_operator_once_and_the_gauge_holds_while_it_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once per pending reset: a Warning Event `MigPendingReset` on the MigLayout naming the
    card and what to do; `elasticgpu_agent_mig_pending_reset` is 1 for the card until the
    operator's reset, 0 for the others and after."""
    from prometheus_client import CollectorRegistry

    from elastic_gpu.agent.metrics import MigPendingResetCollector

    clock = ManualClock()
    gpus = carved()
    gpus[0].reset_needed = True
    api, applier = setup(monkeypatch, clock, gpus)
    told: list[tuple[dict[str, Any], str, str]] = []
    phase_when_told: list[str] = []

    def warn(obj: Mapping[str, Any], reason: str, message: str) -> None:
        told.append((dict(obj), reason, message))
        phase_when_told.append(status(api, "GPU-aaaa")["phase"])

    applier.warn = warn
    registry = CollectorRegistry()
    registry.register(MigPendingResetCollector(
        NODE, lambda: [device(api, 0), device(api, 1)], applier.pending_reset))

    def gauge(index: int) -> float | None:
        return registry.get_sample_value("elasticgpu_agent_mig_pending_reset", {
            "node": NODE, "device_index": str(index), "device_uuid": device(api, index).uuid,
            "model": device(api, index).model})

    want(api, "GPU-aaaa")
    applier.round()
    clock.advance(FENCE_SETTLE_S)
    assert gauge(0) == 0
    for _ in range(3):  # every round reads the mode again; the operator is told once
        assert applier.round() == {"GPU-aaaa": "PendingReset"}
    assert len(told) == 1
    # the status is written first: who reads the Event finds the MigLayout PendingReset
    assert phase_when_told == ["PendingReset"]
    obj, reason, message = told[0]
    assert reason == "MigPendingReset"
    assert obj["kind"] == "MigLayout" and obj["metadata"]["name"] == ml.object_name(NODE,
                                                                                    "GPU-aaaa")
    assert obj["metadata"]["uid"]  # the served object's, so kubectl describe shows it
    assert "GPU 0 (GPU-aaaa" in message and "nvidia-smi -r -i 0" in message
    assert "MIG mode off is pending a GPU reset" in message
    assert (gauge(0), gauge(1)) == (1, 0)
    SimNvml.reset(gpus[0])
    assert applier.round() == {"GPU-aaaa": "Applied"}
    assert gauge(0) == 0 and len(told) == 1


@pytest.mark.parametrize("publish_each_step", [True, False], ids=["each-step", "per-round"])
def test_on_a_dra_node_a_card_waiting_for_its_reset_publishes_no_whole_card(
        monkeypatch: pytest.MonkeyPatch, publish_each_step: bool) -> None:
    """The DRA agent over the scripted NVML: a merge-back whose MIG mode off waits for a reset
    leaves a card in MIG mode with no instance; its card device is published with the fence
    and the mig-mode taint (`on-pending-off`), read back in MIG mode, so no claim is given a
    card CUDA cannot use whole; after the operator's reset, one untainted card device. Either
    way of publishing (per step; once per round, as the running agent does), the slices say
    the card's mode before the MigLayout's phase does: who reads `PendingReset` (the operator,
    the integration test) finds the taint already there."""
    import shutil
    import tempfile
    from pathlib import Path
    from typing import cast

    from egpu_testing.dynamic_agent import NoPods
    from elastic_gpu.agent.dra.node import DraNode
    from elastic_gpu.agent.dra.slices_api import existing_slices
    from elastic_gpu.agent.runtime import Agent
    from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
    from elastic_gpu.core.dra.devices import FENCE_TAINT, MIG_MODE_TAINT
    from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
    from elastic_gpu.core.dra.sliceview import node_cards
    from elastic_gpu.kube.sync import SyncKubeClient

    clock = ManualClock()
    gpus = carved()
    gpus[0].reset_needed = True
    SimNvml(monkeypatch, gpus)
    api = MemoryApi()
    api.add(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "uid": "uid-1",
        "labels": {GPU_MODE_LABEL: GPU_MODE_DRA, MIG_DYNAMIC_LABEL: "true"}},
        "status": {"capacity": dict(HOST), "allocatable": dict(HOST)}})
    root = Path(tempfile.mkdtemp(prefix="egpu-migdra-", dir="/tmp"))  # short: socket paths
    config = parse_config({"usage": {"enabled": False}, "syncSeconds": 3600,
                           "healthCheck": {"enabled": False}, "dra": {
                               "enabled": True, "pluginDirectory": str(root / "dra"),
                               "registryDirectory": str(root / "registry"),
                               "cdiDirectory": str(root / "cdi")}})
    agent = Agent(config, NvmlBackend(), NODE, client=cast(SyncKubeClient, api),
                  pods=NoPods(), plugin_dir=root / "plugins")
    agent.mode.start()
    try:
        assert isinstance(agent.mode, DraNode)
        fence, held = agent.mode.mig_seam()
        applier = MigApplier(cast(SyncKubeClient, api), NODE, agent.backend,
                             agent.layout_changed, clock=clock, fence=fence, held=held,
                             publish_each_step=publish_each_step)

        def card_device() -> dict[str, Any]:
            return next(d for s in existing_slices(cast(SyncKubeClient, api), NODE)
                        for d in s["spec"].get("devices") or [] if d["name"] == "gpu-0")

        def mode_taint() -> str | None:
            devices = [d for s in existing_slices(cast(SyncKubeClient, api), NODE)
                       for d in s["spec"].get("devices") or [] if d["name"] == "gpu-0"]
            return next((t["value"] for d in devices for t in d.get("taints") or []
                         if t["key"] == MIG_MODE_TAINT), None) if devices else "no card device"

        phases: list[tuple[str, str | None]] = []  # (phase written, the slices' mode then)
        patch = api.patch

        def recording_patch(path: str, body: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
            out = patch(path, body, *args, **kwargs)
            if path.startswith(MIG_LAYOUTS.path()):
                phases.append((body["status"]["phase"], mode_taint()))
            return out

        monkeypatch.setattr(api, "patch", recording_patch)

        want(api, "GPU-aaaa")
        applier.round()
        clock.advance(FENCE_SETTLE_S)
        assert applier.round() == {"GPU-aaaa": "PendingReset"}
        taints = {t["key"]: t["value"] for t in card_device()["taints"]}
        assert taints == {FENCE_TAINT: "Fenced", MIG_MODE_TAINT: "on-pending-off"}
        slices = existing_slices(cast(SyncKubeClient, api), NODE)
        back = node_cards(slices)[NODE][0]
        assert back.mig_enabled and back.mig_mode == MigMode(current=True, pending=False)
        SimNvml.reset(gpus[0])
        assert applier.round() == {"GPU-aaaa": "Applied"}
        assert "taints" not in card_device()
        assert ("PendingReset", "on-pending-off") in phases
        assert phases[-1] == ("Applied", None)
        assert [taint for phase, taint in phases if phase == "PendingReset"] == [
            "on-pending-off"] * len([p for p, _ in phases if p == "PendingReset"])
    finally:
        agent.mode.stop()
        shutil.rmtree(root, ignore_errors=True)
