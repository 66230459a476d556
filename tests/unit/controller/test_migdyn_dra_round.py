"""The mig-dynamic controller's round on DRA nodes, over fixed caches: a waiting pod's MIG claim
by profile gets a MigLayout on an opted-in DRA card no claim holds (the cards read back from
the slices, the holders from allocated claims); a card a claim holds is never changed; a claim
already allocated, or one not read, is no demand; a device-plugin MIG pod never carves a DRA
node. The shapes a claim is written in (issue 42): `||` of profiles carves the first written,
`firstAvailable` the first subrequest the planner can serve, a memory bound the smallest
profile with that memory, a free instance of a later choice serves without a carve, and a
claim not read is reported once (an Event on its pod). `core.dra.migdemand`'s reading of a
claim, and the fence taint read back from a slice."""

from __future__ import annotations

import asyncio
from typing import Any

from egpu_testing.defrag import StaticInformers, mig_pod
from elastic_gpu.controller.config import ControllerConfig, MigConfig, MigDynamicConfig
from elastic_gpu.controller.manager import Context, Metrics
from elastic_gpu.controller.mig.dynamic import MigDynamicController
from elastic_gpu.controller.provisioning import ExtenderClient
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.dra.classes import MIG_CLASS
from elastic_gpu.core.dra.devices import DRIVER, FENCE_TAINT, node_slices
from elastic_gpu.core.dra.inventory import card_from_device
from elastic_gpu.core.dra.migdemand import claim_instances, pod_claim_demand
from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
from elastic_gpu.core.model import Card, Health, MigInstance, MigMode
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import (
    MIG_LAYOUTS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)

A100 = "A100-SXM4-80GB"
NODE = "d0"
CARDS = [Card(i, f"GPU-{NODE}-{i}", A100, 81920) for i in range(2)]
ON = MigDynamicConfig(enabled=True, merge_cooldown_s=60)
SELECT_3G = 'device.attributes["gpu.elasticgpu.io"].profile == "3g.40gb"'


class LayoutClient:
    def __init__(self) -> None:
        self.written: list[tuple[str, list[dict[str, Any]]]] = []

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        assert path == MIG_LAYOUTS.path()
        self.written.append((obj["spec"]["cardUUID"], obj["spec"]["instances"]))
        return obj


def mig_claim(name: str, expression: str = SELECT_3G, allocated_to: str | None = None,
              count: int = 1) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": MIG_CLASS, "count": count,
            "selectors": [{"cel": {"expression": expression}}]}}]}}}
    if allocated_to is not None:
        claim["status"] = {"allocation": {"devices": {"results": [
            {"request": "mig", "driver": DRIVER, "pool": NODE, "device": allocated_to}]}}}
    return claim


def whole_claim(name: str, device: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]}}}}


def waiting_claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "annotations": {}},
            "spec": {"resourceClaims": [{"name": "mig", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "resources": {"claims": [{"name": "mig"}]}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def make(pods: list[dict[str, Any]], claims: list[dict[str, Any]],
         cards: list[Card] = CARDS) -> tuple[MigDynamicController, LayoutClient]:
    client = LayoutClient()
    informers = StaticInformers()
    ctx = Context(client, informers, EventRecorder(client, "test"),  # type: ignore[arg-type]
                  Metrics(), ExtenderClient("http://127.0.0.1:1"), "test",
                  config=ControllerConfig(mig=MigConfig(dynamic=ON)))
    controller = MigDynamicController(ctx)
    informers.informer(NODES.path(), "").objects.append(
        {"metadata": {"name": NODE, "labels": {MIG_DYNAMIC_LABEL: "true",
                                               GPU_MODE_LABEL: GPU_MODE_DRA}},
         "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}})
    informers.informer(RESOURCE_SLICES.path(), "").objects.extend(node_slices(NODE, cards, 1))
    informers.informer(RESOURCE_CLAIMS.path(), "").objects.extend(claims)
    informers.informer(PODS.path(), "").objects.extend(pods)
    return controller, client


def run(controller: MigDynamicController) -> None:
    asyncio.run(controller.round(100.0))


def test_a_waiting_mig_claim_carves_a_dra_card_no_claim_holds() -> None:
    controller, client = make([waiting_claim_pod("p", "m3")],
                              [mig_claim("m3"), whole_claim("whole", "gpu-0")])
    run(controller)
    assert client.written == [(CARDS[1].uuid, [{"profile": "3g.40gb", "start": 4}])]


def test_a_card_a_claim_holds_is_never_changed() -> None:
    controller, client = make([waiting_claim_pod("p", "m3")],
                              [mig_claim("m3"), whole_claim("whole", "gpu-0")], CARDS[:1])
    run(controller)
    assert client.written == []


def test_an_allocated_claim_or_no_profile_is_no_demand() -> None:
    for claim in (mig_claim("m3", allocated_to="gpu-1"),
                  mig_claim("m3", 'device.attributes["gpu.elasticgpu.io"].profile != "x"')):
        controller, client = make([waiting_claim_pod("p", "m3")], [claim])
        run(controller)
        assert client.written == []


def test_a_device_plugin_mig_pod_never_carves_a_dra_node() -> None:
    controller, client = make([mig_pod("dp", profile="3g.40gb")], [])
    run(controller)
    assert client.written == []


def profiles(spec: dict[str, Any]) -> list[str]:
    asks, problems = claim_instances(spec)
    assert problems == []
    return [ask.profiles[0].name for ask in asks]


def test_claim_instances_read_the_documented_selector_and_count() -> None:
    assert profiles(mig_claim("c", count=2)["spec"]) == ["3g.40gb", "3g.40gb"]
    swapped = mig_claim("c", '"1g.10gb" == device.attributes["gpu.elasticgpu.io"].profile')
    assert profiles(swapped["spec"]) == ["1g.10gb"]
    assert profiles(whole_claim("w", "gpu-0")["spec"]) == []
    pod = waiting_claim_pod("p", "c")
    claims = {"ns/c": mig_claim("c", count=2)}
    demand, unread = pod_claim_demand(pod, claims, None)
    assert [d.key for d in demand] == ["resourceclaim:ns/c", "resourceclaim:ns/c#1"]
    assert unread == []


def test_a_fenced_card_is_published_tainted_and_read_back_fenced() -> None:
    fenced = Card(0, "GPU-x", A100, 81920, health=Health.FENCED)
    (slice_,) = node_slices(NODE, [fenced], 1)
    (device,) = slice_["spec"]["devices"]
    assert [t["key"] for t in device["taints"]] == [FENCE_TAINT]
    card = card_from_device(device)
    assert card is not None and card.health is Health.FENCED


ATTR = 'device.attributes["gpu.elasticgpu.io"].profile'
TWENTY_GI = 'device.capacity["gpu.elasticgpu.io"].memory.compareTo(quantity("20Gi")) >= 0'


def first_available(name: str, *expressions: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "mig", "firstAvailable": [
                {"name": f"s{k}", "deviceClassName": MIG_CLASS,
                 "selectors": [{"cel": {"expression": e}}]}
                for k, e in enumerate(expressions)]}]}}}


class Recorded(EventRecorder):
    def __init__(self) -> None:
        super().__init__(None, "test")  # type: ignore[arg-type]
        self.events: list[tuple[str, str, str, str]] = []

    def record(self, obj: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], type_, reason, message))


def test_an_or_of_profiles_carves_the_first_written() -> None:
    claim = mig_claim("m", f'{ATTR} == "2g.20gb" || {ATTR} == "1g.10gb"')
    controller, client = make([waiting_claim_pod("p", "m")], [claim], CARDS[:1])
    run(controller)
    assert client.written == [(CARDS[0].uuid, [{"profile": "2g.20gb", "start": 4}])]


def test_first_available_carves_the_first_subrequest_the_planner_can_serve() -> None:
    # the first names a profile no A100-80GB has: the second is carved
    claim = first_available("m", f'{ATTR} == "3g.71gb"', f'{ATTR} == "3g.40gb"',
                            f'{ATTR} == "1g.10gb"')
    controller, client = make([waiting_claim_pod("p", "m")], [claim], CARDS[:1])
    run(controller)
    assert client.written == [(CARDS[0].uuid, [{"profile": "3g.40gb", "start": 4}])]


def test_a_memory_bound_carves_the_smallest_profile_with_that_memory() -> None:
    controller, client = make([waiting_claim_pod("p", "m")], [mig_claim("m", TWENTY_GI)],
                              CARDS[:1])
    run(controller)
    assert client.written == [(CARDS[0].uuid, [{"profile": "1g.20gb", "start": 6}])]


def test_a_free_instance_of_a_later_choice_serves_it_without_a_carve() -> None:
    carved = [Card(0, CARDS[0].uuid, A100, 81920, mig=(MigInstance(
        MigProfile.parse("1g.10gb"), "MIG-a", start=6),))]
    claim = first_available("m", f'{ATTR} == "3g.40gb"', f'{ATTR} == "1g.10gb"')
    controller, client = make([waiting_claim_pod("p", "m")], [claim], carved)
    decided = asyncio.run(controller.round(100.0))
    assert client.written == [] and decided is not None
    assert decided.matched == (("resourceclaim:ns/m", "MIG-a"),)


def test_a_claim_not_read_is_reported_once_on_its_pod_and_carves_nothing() -> None:
    controller, client = make([waiting_claim_pod("p", "m")],
                              [mig_claim("m", f'{ATTR}.startsWith("1g")')])
    recorder = controller.ctx.recorder = Recorded()
    run(controller)
    run(controller)
    assert client.written == []
    ((pod, kind, reason, message),) = recorder.events
    assert (pod, kind, reason) == ("p", "Warning", "MigClaimUnreadable")
    assert "ns/m" in message and "startsWith" in message


def test_a_dra_card_left_in_mig_mode_is_carved_before_a_whole_one() -> None:
    """A DRA card in MIG mode with no instance is published with the mig-mode taint (no whole
    card) and read back carved: a waiting MIG claim is carved there, the whole card kept."""
    left_on = Card(1, "GPU-d0-1", A100, 81920, mig_mode=MigMode(current=True, pending=True))
    controller, client = make([waiting_claim_pod("p", "m3")], [mig_claim("m3")],
                              [CARDS[0], left_on])
    run(controller)
    assert [uuid for uuid, _ in client.written] == [left_on.uuid]
