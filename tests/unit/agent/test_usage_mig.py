"""MIG instances observed (issue 28): each instance's memory in use and its containers, from NVML's
MIG device handles (the scripted NVML double) and from the fake backend's usage model, through
the sampling loop to `/metrics`. NVML has no utilisation per MIG instance: none is published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.scripted_nvml import SimNvml, two_gpus
from elastic_gpu.agent.backends.base import MigSample, ProcessSample
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.agent.config import UsageConfig
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.metrics import usage_families
from elastic_gpu.agent.usage.monitor import UsageMonitor, UsageSinks
from elastic_gpu.agent.usage.observe import observe_migs
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.usage import ContainerRef, MigUsage, ProcessUse, observe_mig

NODE = "n1"
MIB = 1 << 20


def test_nvml_samples_each_mig_instance_from_its_own_handle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig = [("MIG-a", 3, 40192, 0), ("MIG-b", 3, 40192, 4)]
    gpus[0].mig_processes = {"MIG-a": [(100, 3000), (101, 500)], "MIG-b": [(200, 7000)]}
    gpus[0].process_util = None  # MIG mode: no per-process samples
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    card, plain = backend.sample()
    assert card.mig == (MigSample("MIG-a", 3500, (ProcessSample(100, 3000),
                                                  ProcessSample(101, 500))),
                        MigSample("MIG-b", 7000, (ProcessSample(200, 7000),)))
    # The parent lists every instance's processes (what the card-level figures are made of).
    assert [p.pid for p in card.processes] == [100, 101, 200] and card.used_mib == 10500
    assert plain.mig == ()


def test_an_instance_that_does_not_answer_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mig = [("MIG-a", 3, 40192, 0)]
    sim = SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    import pynvml

    def refuse(handle: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses",
                        lambda h: refuse(h) if getattr(h, "uuid", "") == "MIG-a"
                        else sim.running(h))
    (card, _) = backend.sample()
    assert card.mig == ()


def test_an_instances_usage_is_the_larger_figure_and_its_containers_sums() -> None:
    a, b = ContainerRef("ml", "a", "main"), ContainerRef("ml", "b", "main")
    use = observe_mig(0, "MIG-a", 1000, [ProcessUse(3000, None, a), ProcessUse(500, None, a),
                                         ProcessUse(200, None, None)])
    assert use == MigUsage(0, "MIG-a", 3700, ((a, 3500),))
    assert observe_mig(1, "MIG-b", 9000, [ProcessUse(100, None, b)]).used_mib == 9000


# -- the fake backend and the sampling loop --------------------------------------------------

INVENTORY = {"cards": [{"model": "A100-SXM4-80GB", "memoryMiB": 81920, "mig": [
    {"profile": "3g.40gb", "uuid": "MIG-a", "start": 0},
    {"profile": "3g.40gb", "uuid": "MIG-b", "start": 4}]}]}


def mig_pod(name: str, mig: str, memory: int) -> dict[str, Any]:
    share = CardShare(0, f"GPU-fake-{NODE}-0", 0, 40960, "mig", mig)
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": {
                             ann.ASSIGNMENT: Assignment(NODE, {"main": (share,)}).to_json(),
                             ann.ASSIGNED_NODE: NODE,
                             USAGE_ANNOTATION: json.dumps({"main": {"memoryMiB": memory}})}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}}


def test_the_fake_models_mig_instances_and_the_loop_publishes_their_memory(tmp_path: Path
                                                                          ) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    backend = FakeBackend.from_file(inventory, NODE)
    cards = logical_cards(backend.discover(), False)
    pods = [mig_pod("a", "MIG-a", 3000), mig_pod("b", "MIG-b", 12000)]
    monitor = UsageMonitor(NODE, cards, backend, UsageConfig(), lambda: pods,
                           UsageSinks(None, lambda *event: None, lambda p: None),
                           proc=tmp_path / "no-proc", stamp=lambda: "T")
    view = monitor.tick()
    a, b = ContainerRef("ml", "a", "main"), ContainerRef("ml", "b", "main")
    assert view.mig == {"MIG-a": MigUsage(0, "MIG-a", 3000, ((a, 3000),)),
                        "MIG-b": MigUsage(0, "MIG-b", 12000, ((b, 12000),))}
    # The card's own figures are the parent's: both instances' processes.
    assert view.cards[0].used_mib == 15000 and view.cards[0].out_of_band_mib == 0

    families = {f.name: f for f in usage_families(NODE, [lc.card for lc in cards], view.cards,
                                                  view.over, 0, view.mig)}
    samples = {s.labels["mig_uuid"]: (s.labels["profile"], s.value)
               for s in families["elasticgpu_agent_mig_gpu_memory_used_bytes"].samples}
    assert samples == {"MIG-a": ("3g.40gb", 3000 * MIB), "MIG-b": ("3g.40gb", 12000 * MIB)}
    # No utilisation per instance: no family claims one.
    assert not any("mig" in name and "utilization" in name for name in families)


def test_mig_samples_of_a_card_the_node_does_not_have_are_left_out() -> None:
    backend = FakeBackend.from_dict(INVENTORY, NODE)
    cards = logical_cards(backend.discover(), False)
    (sample,) = backend.sample()
    assert [m.uuid for m in sample.mig] == ["MIG-a", "MIG-b"]  # idle instances: 0 in use
    assert all(m.used_mib == 0 and m.processes == () for m in sample.mig)
    assert observe_migs([sample], cards[:0], lambda pid: None) == {}
