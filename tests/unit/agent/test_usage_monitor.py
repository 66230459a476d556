"""The sampling loop over the fake backend's usage model: what it writes and when (the rate
limit), the metrics of a sample, and drift (Events, the evict policy)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.clock import ManualClock
from egpu_testing.workbench import metric_value
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend
from elastic_gpu.agent.config import UsageConfig, parse_config
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.agent.usage.monitor import EVICTED, OVER_SHARE, UsageMonitor, UsageSinks
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.usage import CardUsage

NODE = "n1"
CARDS = [{"model": "A100", "memoryMiB": 40960} for _ in range(2)]


def pod(name: str, shares: dict[str, list[CardShare]], use: dict[str, dict[str, int]],
        owned: bool = True) -> dict[str, Any]:
    assignment = Assignment(NODE, {c: tuple(s) for c, s in shares.items()})
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                            "annotations": {ann.ASSIGNMENT: assignment.to_json(),
                                            ann.ASSIGNED_NODE: NODE,
                                            USAGE_ANNOTATION: json.dumps(use)}}
    if owned:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": "u",
                                    "apiVersion": "apps/v1"}]
    return {"metadata": meta, "spec": {"nodeName": NODE,
                                       "containers": [{"name": c} for c in shares]},
            "status": {"phase": "Running"}}


def share(card: int, milli: int, mib: int) -> CardShare:
    return CardShare(card, f"GPU-fake-{NODE}-{card}", milli, mib)


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[int, CardUsage]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []

    def sinks(self) -> UsageSinks:
        return UsageSinks(lambda i, u: self.writes.append((i, u)),
                          lambda p, t, r, m: self.events.append((p["metadata"]["name"], r, m)),
                          lambda p: self.deleted.append(p["metadata"]["name"]))


def monitor(tmp_path: Path, pods: list[dict[str, Any]], usage: dict[str, Any] | None = None,
            **config: Any) -> tuple[UsageMonitor, Recorder, ManualClock, Path]:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"cards": CARDS}))
    backend = FakeBackend.from_file(inventory, NODE)
    recorder, clock = Recorder(), ManualClock(0.0)
    mon = UsageMonitor(NODE, logical_cards(backend.discover(), False), backend,
                       UsageConfig.model_validate(config), lambda: pods, recorder.sinks(),
                       proc=tmp_path / "no-proc", clock=clock, stamp=lambda: "T")
    return mon, recorder, clock, inventory


def test_a_sample_maps_holders_and_first_writes_every_card(tmp_path: Path) -> None:
    pods = [pod("train", {"main": [share(0, 500, 8192)]}, {"main": {"memoryMiB": 6000,
                                                                    "smPercent": 55}})]
    mon, rec, _, _ = monitor(tmp_path, pods)
    view = mon.tick()
    assert view.cards[0].containers[0].memory_mib == 6000
    assert (view.cards[0].used_mib, view.cards[0].out_of_band_mib, view.cards[0].sm_percent) \
        == (6000, 0, 55)
    assert [i for i, _ in rec.writes] == [0, 1] and view.over == []


def test_writes_hold_the_period_but_out_of_band_memory_is_written_at_once(tmp_path: Path
                                                                          ) -> None:
    use = {"main": {"memoryMiB": 6000, "smPercent": 55}}
    pods = [pod("train", {"main": [share(0, 500, 8192)]}, use)]
    mon, rec, clock, inventory = monitor(tmp_path, pods, writeSeconds=30)
    mon.tick()
    rec.writes.clear()
    for t in range(1, 30):  # a busy container whose use moves every sample
        clock.now = t
        use["main"]["memoryMiB"] = 6000 + 500 * (t % 3)
        pods[0]["metadata"]["annotations"][USAGE_ANNOTATION] = json.dumps(use)
        mon.tick()
    assert rec.writes == []
    # Another process takes 20 GiB of card 1: written now, not in up to 30 s.
    clock.now = 29.5
    inventory.write_text(yaml.safe_dump({"cards": [CARDS[0], {**CARDS[1], "usage": {
        "outOfBandMiB": 20480}}]}))
    os.utime(inventory, ns=(1, 10**18))
    mon.tick()
    assert [(i, u.out_of_band_mib) for i, u in rec.writes] == [(1, 20480)]
    clock.now = 30.0
    rec.writes.clear()
    mon.tick()  # the period's round: card 0 changed beyond rounding, card 1 did not
    assert [i for i, _ in rec.writes] == [0]
    assert mon.writes == 2 + 1 + 1


def test_a_container_over_its_share_gets_one_event_per_period(tmp_path: Path) -> None:
    pods = [pod("train", {"main": [share(0, 500, 4096)]}, {"main": {"memoryMiB": 6000}}),
            pod("ok", {"main": [share(1, 500, 8192)]}, {"main": {"memoryMiB": 2000}})]
    mon, rec, clock, _ = monitor(tmp_path, pods, drift={"eventSeconds": 300})
    view = mon.tick()
    assert [(o.ref.pod, o.card, o.used_mib, o.share_mib) for o in view.over] == [
        ("train", 0, 6000, 4096)]
    assert [(name, reason) for name, reason, _ in rec.events] == [("train", OVER_SHARE)]
    assert "uses 6000 MiB" in rec.events[0][2] and "share is 4096 MiB" in rec.events[0][2]
    clock.now = 100
    mon.tick()
    assert len(rec.events) == 1
    clock.now = 300
    mon.tick()
    assert len(rec.events) == 2 and rec.deleted == []


@pytest.mark.parametrize(("owned", "unowned_too", "deleted"), [
    (True, False, ["train"]), (False, False, []), (False, True, ["train"])])
def test_evict_deletes_owned_pods_and_unowned_only_when_told(
        tmp_path: Path, owned: bool, unowned_too: bool, deleted: list[str]) -> None:
    pods = [pod("train", {"main": [share(0, 500, 4096)]}, {"main": {"memoryMiB": 6000}},
                owned=owned)]
    mon, rec, _, _ = monitor(tmp_path, pods, drift={"policy": "evict",
                                                    "evictUnownedPods": unowned_too})
    mon.tick()
    assert rec.deleted == deleted
    reason, message = rec.events[0][1], rec.events[0][2]
    if deleted:
        assert reason == EVICTED and "the pod is deleted" in message
    else:
        assert reason == OVER_SHARE and "not evicted: no controller owns the pod" in message


def test_the_agents_metrics_show_the_newest_sample(tmp_path: Path, plugin_dir: Path) -> None:
    class Pods:
        def __init__(self, pods: list[dict[str, Any]]) -> None:
            self.pods = pods

        def on_node(self, node: str) -> list[dict[str, Any]]:
            return self.pods

        pending_on_node = live_on_node = on_node

    inventory = {"cards": [CARDS[0], {**CARDS[1], "usage": {"outOfBandMiB": 1024,
                                                             "smPercent": 7}}]}
    pods = Pods([pod("train", {"main": [share(0, 500, 4096)]},
                     {"main": {"memoryMiB": 6000, "smPercent": 40}})])
    agent = Agent(parse_config({"healthCheck": {"enabled": False}}),
                  FakeBackend.from_dict(inventory, NODE), NODE, pods=pods,
                  plugin_dir=plugin_dir)
    try:
        assert agent.usage is not None
        agent.usage.tick()
        port = agent.serve_metrics("127.0.0.1", 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        agent.stop()
    main = 'namespace="team-a",pod="train",container="main",device_index="0"'
    assert metric_value(text, f"elasticgpu_agent_container_gpu_memory_used_bytes{{{main}}}"
                        ) == 6000 << 20
    assert metric_value(text, f"elasticgpu_agent_container_gpu_sm_utilization_ratio{{{main}}}"
                        ) == 0.4
    assert metric_value(text, f"elasticgpu_agent_container_over_share{{{main}}}") == 1
    card1 = 'device_index="1"'
    assert metric_value(text, f"elasticgpu_agent_card_out_of_band_memory_bytes{{{card1}}}"
                        ) == 1024 << 20
    assert metric_value(text, f"elasticgpu_agent_card_gpu_memory_used_bytes{{{card1}}}"
                        ) == 1024 << 20
    assert metric_value(text, f"elasticgpu_agent_card_gpu_sm_utilization_ratio{{{card1}}}"
                        ) == 0.07
    assert metric_value(text, f'elasticgpu_agent_usage_writes_total{{node="{NODE}"}}') == 0


def test_a_failed_write_is_tried_again_by_the_next_round(tmp_path: Path) -> None:
    mon, rec, clock, _ = monitor(tmp_path, [], writeSeconds=30)
    failing = {1}

    def write(index: int, usage: CardUsage) -> None:
        if index in failing:
            raise RuntimeError("API server unavailable")
        rec.writes.append((index, usage))

    mon.sinks.write = write
    mon.tick()
    assert [i for i, _ in rec.writes] == [0] and set(mon.written) == {0}
    failing.clear()
    clock.now = 1.0  # card 1 was never written: urgent, not held for the period
    mon.tick()
    assert [i for i, _ in rec.writes] == [0, 1] and mon.writes == 2
