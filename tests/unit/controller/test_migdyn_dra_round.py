"""The mig-dynamic controller's round on DRA nodes, over fixed caches: a waiting pod's MIG claim
by profile gets a MigLayout on an opted-in DRA card no claim holds (the cards read back from
the slices, the holders from allocated claims); a card a claim holds is never changed; a claim
already allocated, or asking no profile by equality, is no demand; a device-plugin MIG pod
never carves a DRA node. `core.dra.migdemand`'s reading of a claim, and the fence taint read
back from a slice."""

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
from elastic_gpu.core.dra.migdemand import claim_profiles, pod_claim_demand
from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
from elastic_gpu.core.model import Card, Health
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


def test_claim_profiles_read_the_documented_selector_and_count() -> None:
    assert [p.name for p in claim_profiles(mig_claim("c", count=2)["spec"])] == \
        ["3g.40gb", "3g.40gb"]
    swapped = mig_claim("c", '"1g.10gb" == device.attributes["gpu.elasticgpu.io"].profile')
    assert [p.name for p in claim_profiles(swapped["spec"])] == ["1g.10gb"]
    assert claim_profiles(whole_claim("w", "gpu-0")["spec"]) == []
    pod = waiting_claim_pod("p", "c")
    claims = {"ns/c": mig_claim("c", count=2)}
    assert [d.key for d in pod_claim_demand(pod, claims, None)] == \
        ["resourceclaim:ns/c", "resourceclaim:ns/c#1"]


def test_a_fenced_card_is_published_tainted_and_read_back_fenced() -> None:
    fenced = Card(0, "GPU-x", A100, 81920, health=Health.FENCED)
    (slice_,) = node_slices(NODE, [fenced], 1)
    (device,) = slice_["spec"]["devices"]
    assert [t["key"] for t in device["taints"]] == [FENCE_TAINT]
    card = card_from_device(device)
    assert card is not None and card.health is Health.FENCED
