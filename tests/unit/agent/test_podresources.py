"""The kubelet's PodResources API in the agent: the thin `List` client over a real unix socket
(egpu_testing.podresources serves kubelet's side), device IDs read as cards, and what the
sampling loop does with it: a time-sliced replica's container holds the card kubelet chose,
and a container running on a card kubelet never gave it is reported. The real kubelet's socket
is read in tests/integration/agent/test_podresources_realnode.py."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.podresources import PodResourcesDouble
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend
from elastic_gpu.agent.config import UsageConfig, parse_config
from elastic_gpu.agent.devices import build_plans, logical_cards
from elastic_gpu.agent.podresources import (
    KubeletDevices,
    PodResourcesError,
    kubelet_cards,
    list_devices,
)
from elastic_gpu.agent.usage.monitor import UsageMonitor, UsageSinks
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.usage import ContainerRef, KubeletMismatch, kubelet_mismatches

NODE = "n1"
CARDS = [{"model": "A100", "memoryMiB": 40960} for _ in range(2)]
GPU = "nvidia.com/gpu"
CORE = "elasticgpu.io/gpu-core"


@pytest.fixture
def kubelet() -> Iterator[PodResourcesDouble]:
    # A unix socket path must stay under 108 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="podres", dir="/tmp") as name:
        double = PodResourcesDouble(Path(name) / "kubelet.sock")
        double.start()
        yield double
        double.stop()


def ref(pod: str, container: str = "main") -> ContainerRef:
    return ContainerRef("team-a", pod, container)


def test_list_reads_every_containers_devices_over_the_socket(kubelet: PodResourcesDouble
                                                             ) -> None:
    kubelet.allocations = {
        ("team-a", "train", "main"): {GPU: ["GPU-fake-n1-1"], "example.com/nic": ["nic0"]},
        ("team-a", "train", "side"): {},
        ("team-b", "infer", "main"): {CORE: ["0-1", "0-2"]}}
    devices = list_devices(kubelet.socket)
    assert sorted(devices, key=lambda d: (d.ref, d.resource)) == [
        KubeletDevices(ref("train"), "example.com/nic", ("nic0",)),
        KubeletDevices(ref("train"), GPU, ("GPU-fake-n1-1",)),
        KubeletDevices(ContainerRef("team-b", "infer", "main"), CORE, ("0-1", "0-2"))]


def test_no_socket_and_a_hung_kubelet_are_clear_errors(kubelet: PodResourcesDouble,
                                                       tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match="no kubelet PodResources socket at"):
        list_devices(tmp_path / "absent.sock")
    kubelet.hang.set()
    with pytest.raises(PodResourcesError, match="DEADLINE_EXCEEDED"):
        list_devices(kubelet.socket, timeout_s=0.3)


def test_device_ids_are_read_as_cards_of_this_agents_resources_only() -> None:
    config = parse_config({"timeSlicing": {"replicas": 2}})
    cards = logical_cards(FakeBackend.from_dict({"cards": CARDS}, NODE).discover(), False)
    plans = build_plans(cards, config)
    devices = [KubeletDevices(ref("a"), GPU, ("GPU-fake-n1-1::0",)),
               KubeletDevices(ref("b"), CORE, ("0-7", "0-8")),
               KubeletDevices(ref("c"), "example.com/nic", ("0-7",)),  # not ours
               KubeletDevices(ref("d"), GPU, ("GPU-gone::0",))]  # no such device here
    assert kubelet_cards(devices, plans) == {1: {ref("a")}, 0: {ref("b")}}
    assert kubelet_cards(devices, [p for p in plans if p.kubelet_chooses]) == {1: {ref("a")}}


def test_the_cross_check_judges_only_containers_kubelet_gave_devices() -> None:
    seen = {0: {ref("a"), ref("b"), ref("claim")}, 1: {ref("a"), ref("x")}}
    kubelet = {0: {ref("a")}, 1: {ref("b"), ref("x")}}
    assigned = {0: {ref("a"), ref("b")}, 1: {ref("x")}}
    assert kubelet_mismatches(seen, kubelet, assigned) == [
        # on card 0 by its assignment, kubelet's bookkeeping says card 1
        KubeletMismatch(ref("b"), 0, (1,), True),
        # on card 1 by neither: out of band there
        KubeletMismatch(ref("a"), 1, (0,), False)]
    # "claim" holds no device-plugin devices: kubelet cannot judge it
    message = KubeletMismatch(ref("a"), 1, (0,), False).message()
    assert "runs on card 1, but kubelet gave it devices of card(s) 0 only" in message
    assert "out-of-band" in message


# -- the sampling loop ---------------------------------------------------------------------


def pod(name: str, use: dict[str, Any], shares: tuple[CardShare, ...] = ()) -> dict[str, Any]:
    annotations = {USAGE_ANNOTATION: json.dumps(use)}
    if shares:
        annotations[ann.ASSIGNMENT] = Assignment(NODE, {"main": shares}).to_json()
        annotations[ann.ASSIGNED_NODE] = NODE
    return {"metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                         "annotations": annotations},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}}


def sampling(tmp_path: Path, pods: list[dict[str, Any]], kubelet: PodResourcesDouble | None,
             replicas: int = 1) -> UsageMonitor:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"cards": CARDS}))
    backend = FakeBackend.from_file(inventory, NODE)
    cards = logical_cards(backend.discover(), False)
    plans = build_plans(cards, parse_config({"timeSlicing": {"replicas": replicas}}))
    return UsageMonitor(NODE, cards, backend, UsageConfig(), lambda: pods,
                        UsageSinks(None, lambda *event: None, lambda p: None),
                        proc=tmp_path / "no-proc", stamp=lambda: "T",
                        kubelet=(lambda: list_devices(kubelet.socket)) if kubelet else None,
                        plans=plans)


def test_a_time_sliced_replicas_container_holds_the_card_kubelet_chose(
        kubelet: PodResourcesDouble, tmp_path: Path) -> None:
    # Replicas carry no assignment: kubelet's choice of replica ID is the allocation.
    pods = [pod("sliced", {"main": {"memoryMiB": 5000, "smPercent": 30}})]
    kubelet.allocations = {("team-a", "sliced", "main"): {GPU: ["GPU-fake-n1-1::1"]}}
    view = sampling(tmp_path, pods, kubelet, replicas=2).tick()
    assert [(c.pod, c.memory_mib, c.sm_percent) for c in view.cards[1].containers] == [
        ("sliced", 5000, 30)]
    assert view.cards[1].out_of_band_mib == 0 and view.cards[0].containers == ()
    assert view.mismatches == []
    # Without kubelet's answer no one knows the replica's card: nothing is said of it.
    blind = sampling(tmp_path, pods, None, replicas=2).tick()
    assert blind.cards[1].containers == ()


def test_a_container_on_a_card_kubelet_did_not_give_it_is_reported_once(
        kubelet: PodResourcesDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pods = [pod("share", {"main": {"memoryMiB": 2000}}, (CardShare(0, "GPU-fake-n1-0", 300,
                                                                   4096),))]
    # kubelet's bookkeeping put its gpu-core units on card 1 (GetPreferredAllocation could not
    # steer it); Allocate gave card 0, where its process runs.
    kubelet.allocations = {("team-a", "share", "main"): {CORE: [f"1-{k}" for k in range(30)]}}
    monitor = sampling(tmp_path, pods, kubelet)
    with caplog.at_level("WARNING", logger="elastic_gpu.agent.usage.monitor"):
        first = monitor.tick()
        again = monitor.tick()
    assert first.mismatches == again.mismatches == [
        KubeletMismatch(ref("share"), 0, (1,), True)]
    warned = [r.getMessage() for r in caplog.records if "kubelet gave it" in r.getMessage()]
    assert len(warned) == 1 and "its assignment does" in warned[0]
    # The holder is still the assignment's (what Allocate gave): its use is on card 0.
    assert [c.pod for c in first.cards[0].containers] == ["share"]
    # Agreeing again: no mismatch.
    kubelet.allocations = {("team-a", "share", "main"): {CORE: [f"0-{k}" for k in range(30)]}}
    assert monitor.tick().mismatches == []


def test_sampling_goes_on_when_kubelet_cannot_be_read(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    pods = [pod("share", {"main": {"memoryMiB": 2000}}, (CardShare(0, "GPU-fake-n1-0", 300,
                                                                   4096),))]
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"cards": CARDS}))
    backend = FakeBackend.from_file(inventory, NODE)
    cards = logical_cards(backend.discover(), False)
    monitor = UsageMonitor(NODE, cards, backend, UsageConfig(), lambda: pods,
                           UsageSinks(None, lambda *event: None, lambda p: None),
                           proc=tmp_path / "no-proc", stamp=lambda: "T",
                           kubelet=lambda: list_devices(tmp_path / "none.sock"),
                           plans=build_plans(cards, parse_config({})))
    with caplog.at_level("INFO", logger="elastic_gpu.agent.usage.monitor"):
        views = [monitor.tick(), monitor.tick()]
    assert all(v.cards[0].containers[0].memory_mib == 2000 and v.mismatches == []
               for v in views)
    said = [r.getMessage() for r in caplog.records if "PodResources" in r.getMessage()]
    assert len(said) == 1 and "no kubelet PodResources socket" in said[0]
