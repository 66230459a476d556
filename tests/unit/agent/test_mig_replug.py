"""A MIG layout change re-serves only the device plugins whose devices changed (issue 42):
the running agent (`Agent.layout_changed` -> `DevicePluginNode.layout_changed` ->
`PluginManager.update`) keeps serving every other resource (kubelet sees no re-registration),
and publishes once per layout change, after the card's last step, before its fence goes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from egpu_testing.clock import ManualClock
from egpu_testing.dynamic_agent import running_agent
from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.miglayout import MigApplier
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core.mig.apply import FENCE_SETTLE_S, Placed
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.resources import GPUDEVICES, MIG_LAYOUTS
from elastic_gpu.kube.sync import SyncKubeClient

NODE = "replug-000"
CARDS = [f"GPU-fake-{NODE}-{i}" for i in range(3)]
P3, P1 = MigProfile.parse("3g.40gb"), MigProfile.parse("1g.10gb")


@pytest.fixture
def agent() -> Iterator[tuple[MemoryApi, Agent, MigApplier, ManualClock, list[int]]]:
    api = MemoryApi()
    carved = (MigInstance(P3, "MIG-first", 0),)
    backend = FakeBackend.from_cards(
        [Card(i, CARDS[i], "A100-SXM4-80GB", 81920, mig=carved if i == 0 else ())
         for i in range(3)], NODE)
    with running_agent(api, backend, NODE) as running:
        published: list[int] = []

        def layout_changed() -> None:
            published.append(len(published))
            running.layout_changed()

        clock = ManualClock()
        applier = MigApplier(cast(SyncKubeClient, api), NODE, backend, layout_changed,
                             clock=clock, publish_each_step=False)
        yield api, running, applier, clock, published


def servers(agent: Agent) -> dict[str, Any]:
    return {s.resource: s for s in agent.mode.manager.servers}  # type: ignore[attr-defined]


def apply(api: MemoryApi, applier: MigApplier, clock: ManualClock, card: str,
          *placed: Placed) -> None:
    body = ml.layout_spec(NODE, card, placed)
    body["metadata"]["generation"] = 1
    api.create(MIG_LAYOUTS.path(), body)
    applier.round()
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {card: "Applied"} | (
        {CARDS[0]: "Applied"} if card != CARDS[0] else {})


def test_only_the_plugins_whose_devices_changed_are_served_again(
        agent: tuple[MemoryApi, Agent, MigApplier, ManualClock, list[int]]) -> None:
    api, running, applier, clock, published = agent
    before = servers(running)
    assert {"nvidia.com/gpu", "nvidia.com/mig-3g.40gb"} <= set(before)
    # two 1g.10gb beside the 3g.40gb of a carved card (two steps): only the new resource is
    # served, and the node published once
    apply(api, applier, clock, CARDS[0], Placed(0, P3), Placed(4, P1), Placed(5, P1))
    after = servers(running)
    assert set(after) == set(before) | {"nvidia.com/mig-1g.10gb"}
    assert all(after[name] is server for name, server in before.items())
    assert published == [0]  # one publication for the layout change
    assert len(after["nvidia.com/mig-1g.10gb"].plan.devices) == 2
    # a whole card carved: the whole-card plugin and the 3g.40gb one (one device more) are
    # served again; the 1g.10gb plugin, whose devices did not change, keeps serving
    again = servers(running)
    apply(api, applier, clock, CARDS[1], Placed(4, P3))
    now = servers(running)
    assert now["nvidia.com/gpu"] is not again["nvidia.com/gpu"]
    assert now["nvidia.com/mig-3g.40gb"] is not again["nvidia.com/mig-3g.40gb"]
    assert now["nvidia.com/mig-1g.10gb"] is again["nvidia.com/mig-1g.10gb"]
    assert len(now["nvidia.com/gpu"].plan.devices) == 1
    assert len(published) == 2
    card = gd.card_from_object(api.get(GPUDEVICES.path(name=gd.object_name(NODE, 1))))[1]
    assert card.health is Health.HEALTHY and [m.profile for m in card.mig] == [P3]
