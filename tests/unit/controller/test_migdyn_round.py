"""The mig-dynamic controller's round over fixed caches (`egpu_testing.defrag`'s static
informers): a waiting MIG pod gets one MigLayout on an opted-in card no one holds; a layout
still being applied serves it instead of a second carve; nodes without the label, cards held
whole and a controller with `mig.dynamic` off are left alone; waiting whole-card demand merges
a carved card with no holder back after the cool-down. The planner is the real one; the API
server's part is the sandbox must-show's."""

from __future__ import annotations

import asyncio
from typing import Any

from egpu_testing.defrag import StaticInformers, gpu_pod, mig_pod
from elastic_gpu.api import gpudevice
from elastic_gpu.api import miglayout as ml
from elastic_gpu.controller.config import ControllerConfig, MigConfig, MigDynamicConfig
from elastic_gpu.controller.manager import Context, Metrics
from elastic_gpu.controller.mig.dynamic import MigDynamicController
from elastic_gpu.controller.provisioning import ExtenderClient
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.model import Card, MigInstance, MigMode
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import GPUDEVICES, MIG_LAYOUTS, NODES, PODS

A100 = "A100-SXM4-80GB"
P3 = MigProfile.parse("3g.40gb")
ON = MigDynamicConfig(enabled=True, merge_cooldown_s=60)


class LayoutClient:
    """Records the MigLayouts written (create, or a patch of one that exists)."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str, list[dict[str, Any]]]] = []

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        assert path == MIG_LAYOUTS.path()
        self.written.append(("create", obj["metadata"]["name"], obj["spec"]["instances"]))
        return obj

    async def patch(self, path: str, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.written.append(("patch", path.rsplit("/", 1)[-1], patch["spec"]["instances"]))
        return patch


def make(config: MigDynamicConfig, pods: list[dict[str, Any]], cards: dict[str, list[Card]],
         opted: tuple[str, ...] = ("n0",)) -> tuple[MigDynamicController, LayoutClient,
                                                    StaticInformers]:
    client = LayoutClient()
    informers = StaticInformers()
    ctx = Context(client, informers, EventRecorder(client, "test"),  # type: ignore[arg-type]
                  Metrics(), ExtenderClient("http://127.0.0.1:1"), "test",
                  config=ControllerConfig(mig=MigConfig(dynamic=config)))
    controller = MigDynamicController(ctx)
    for name, node_cards in cards.items():
        labels = {MIG_DYNAMIC_LABEL: "true"} if name in opted else {}
        informers.informer(NODES.path(), "").objects.append(
            {"metadata": {"name": name, "labels": labels},
             "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}})
        informers.informer(GPUDEVICES.path(), "").objects.extend(
            gpudevice.card_to_object(name, c) for c in node_cards)
    informers.informer(PODS.path(), "").objects.extend(pods)
    return controller, client, informers


def whole_cards(node: str, n: int) -> list[Card]:
    return [Card(i, f"GPU-{node}-{i}", A100, 81920) for i in range(n)]


def held_whole(name: str, node: str, index: int) -> dict[str, Any]:
    pod = gpu_pod(name, percent=None, node=node)
    pod["metadata"]["annotations"]["elasticgpu.io/assignment"] = pod["metadata"][
        "annotations"]["elasticgpu.io/assignment"].replace(f'"GPU-{node}"',
                                                          f'"GPU-{node}-{index}"')
    return pod


def test_a_waiting_mig_pod_gets_a_layout_on_a_free_opted_in_card() -> None:
    controller, client, _ = make(ON, [held_whole("w", "n0", 0), mig_pod("m", profile="3g.40gb")],
                                 {"n0": whole_cards("n0", 2), "n1": whole_cards("n1", 2)})
    asyncio.run(controller.round(1000.0))
    assert client.written == [("create", ml.object_name("n0", "GPU-n0-1"),
                               [{"profile": "3g.40gb", "start": 4}])]


def test_a_layout_in_flight_serves_the_pod_and_nothing_is_carved_twice() -> None:
    controller, client, informers = make(ON, [mig_pod("m", profile="3g.40gb")],
                                         {"n0": whole_cards("n0", 2)})
    layout = ml.layout_spec("n0", "GPU-n0-0", [Placed(4, P3)])
    layout["metadata"]["generation"] = 1
    informers.informer(MIG_LAYOUTS.path(), "").objects.append(layout)  # no status yet
    asyncio.run(controller.round(1000.0))
    assert client.written == []


def test_nothing_changes_unlabelled_nodes_or_with_dynamic_mig_off() -> None:
    pods = [mig_pod("m", profile="3g.40gb")]
    controller, client, _ = make(ON, pods, {"n1": whole_cards("n1", 2)}, opted=())
    asyncio.run(controller.round(1000.0))
    off, off_client, _ = make(MigDynamicConfig(), pods, {"n0": whole_cards("n0", 2)})
    asyncio.run(off.round(1000.0))
    assert client.written == [] and off_client.written == []


def test_whole_card_demand_merges_a_free_carved_card_back_after_the_cool_down() -> None:
    carved = Card(1, "GPU-n0-1", A100, 81920, mig=(MigInstance(P3, "MIG-a", 4),))
    pods = [held_whole("w", "n0", 0), gpu_pod("big", percent=None)]
    pods[1]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2"}
    controller, client, _ = make(ON, pods, {"n0": [whole_cards("n0", 3)[0], carved,
                                                   whole_cards("n0", 3)[2]]})
    controller.changed_at["GPU-n0-1"] = 990.0  # carved 10 s ago: the cool-down is 60 s
    asyncio.run(controller.round(1000.0))
    assert client.written == []
    asyncio.run(controller.round(1051.0))
    assert client.written == [("create", ml.object_name("n0", "GPU-n0-1"), [])]


def test_a_card_left_in_mig_mode_with_no_instance_is_merged_back_for_whole_demand() -> None:
    """A card whose GPUDevice says MIG mode is on with no instance (`spec.migMode`: a reboot in
    MIG mode, a layout deleted while its mode change waited for a reset) backs no whole card:
    the planner counts it carved, and waiting whole-card demand merges it back (MIG mode off)."""
    left_on = Card(1, "GPU-n0-1", A100, 81920, mig_mode=MigMode(current=True, pending=True))
    pods = [held_whole("w", "n0", 0), gpu_pod("big", percent=None)]
    pods[1]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    controller, client, _ = make(ON, pods, {"n0": [whole_cards("n0", 2)[0], left_on]})
    asyncio.run(controller.round(1000.0))
    assert client.written == [("create", ml.object_name("n0", "GPU-n0-1"), [])]


def _blocked(card: str, instances: list[Placed], generation: int,
             observed: int) -> dict[str, Any]:
    layout = ml.layout_spec("n0", card, instances)
    layout["metadata"]["generation"] = generation
    layout["status"] = {"phase": "Blocked", "observedGeneration": observed,
                        "reason": "the card is held by ns/w"}
    return layout


def test_a_layout_found_blocked_is_put_back_to_the_card_as_it_is() -> None:
    """Seen on the sandbox: a carve planned for a MIG claim was Blocked by a whole-card claim
    allocated meanwhile; the claim was served by a carve of another card, and once the whole
    claim went the stale layout was carried out, a card carved for nothing. A layout found
    Blocked at its spec is put back to the card as it is, with nothing waiting too."""
    controller, client, informers = make(ON, [held_whole("w", "n0", 0)],
                                         {"n0": whole_cards("n0", 2)})
    informers.informer(MIG_LAYOUTS.path(), "").objects.append(
        _blocked("GPU-n0-0", [Placed(4, P3)], generation=1, observed=1))
    asyncio.run(controller.round(1000.0))
    assert client.written == [("patch", ml.object_name("n0", "GPU-n0-0"), [])]


def test_a_blocked_layout_with_a_newer_spec_or_as_the_card_is_left_alone() -> None:
    carved = Card(1, "GPU-n0-1", A100, 81920, mig=(MigInstance(P3, "MIG-a", 4),))
    controller, client, informers = make(ON, [held_whole("w", "n0", 0)],
                                         {"n0": [whole_cards("n0", 2)[0], carved]})
    informers.informer(MIG_LAYOUTS.path(), "").objects.extend([
        _blocked("GPU-n0-0", [Placed(4, P3)], generation=2, observed=1),  # not tried yet
        _blocked("GPU-n0-1", [Placed(4, P3)], generation=1, observed=1)])  # as the card is
    asyncio.run(controller.round(1000.0))
    assert client.written == []
