"""The MIG applier on a DRA node (`agent.dra.miglayout`, through the sandbox's stand-in
`devcluster.mig_agent.fake_dra_applier`) over the in-memory API: the fence is the card's
devices' taint in the slice (the other card's devices untouched), the carve republishes the
partitionable devices and counters and lifts the taint; a card an allocated claim holds is
blocked with no fence left; a restarted applier reads the fence back and settles again; the
DRA agent's own fence (`SliceFence`) is read back from the slices it published."""

from __future__ import annotations

from typing import Any

from egpu_testing.clock import ManualClock
from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.dra.miglayout import SliceFence, with_fences
from elastic_gpu.agent.dra.slices_api import existing_slices, publish_node_slices
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.dra.devices import DRIVER, FENCE_TAINT
from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.mig.apply import FENCE_SETTLE_S, Placed
from elastic_gpu.core.model import Card, Health
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.devcluster import mig_agent
from elastic_gpu.devcluster.dra_nodes import FAKE_INVENTORY_ANNOTATION, inventory_json
from elastic_gpu.kube.resources import MIG_LAYOUTS, NODES, RESOURCE_CLAIMS

NODE = "dra-000"
CARDS = [Card(i, f"GPU-fake-{NODE}-{i}", "A100-SXM4-80GB", 81920) for i in range(2)]
P3 = MigProfile.parse("3g.40gb")


def setup(clock: ManualClock) -> tuple[MemoryApi, Any]:
    api = MemoryApi()
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "uid": "uid-1",
                         "labels": {GPU_MODE_LABEL: GPU_MODE_DRA, MIG_DYNAMIC_LABEL: "true"},
                         "annotations": {FAKE_INVENTORY_ANNOTATION: inventory_json(NODE, CARDS)}}}
    api.add(NODES.path(), node)
    publish_node_slices(api, NODE, CARDS, "uid-1")  # type: ignore[arg-type]
    applier = mig_agent.fake_dra_applier(api, node, lambda step: None)  # type: ignore[arg-type]
    assert applier is not None
    applier.clock = clock
    return api, applier


def want(api: MemoryApi, card: str, *placed: Placed) -> None:
    body = ml.layout_spec(NODE, card, placed)
    body["metadata"]["generation"] = 1
    api.create(MIG_LAYOUTS.path(), body)


def tainted(api: MemoryApi) -> list[str]:
    return [d["name"] for s in existing_slices(api, NODE)  # type: ignore[arg-type]
            for d in s["spec"].get("devices") or []
            if any(t["key"] == FENCE_TAINT for t in d.get("taints") or [])]


def phase(api: MemoryApi, card: str) -> str:
    obj = api.get(MIG_LAYOUTS.path(name=ml.object_name(NODE, card)))
    return str((obj.get("status") or {}).get("phase"))


def test_the_fence_is_a_taint_and_the_carve_is_republished() -> None:
    clock = ManualClock()
    api, applier = setup(clock)
    want(api, CARDS[1].uuid, Placed(4, P3))
    applier.round()
    assert tainted(api) == ["gpu-1"]  # fenced: the devices stay, tainted; card 0 untouched
    assert phase(api, CARDS[1].uuid) != "Applied"
    clock.advance(FENCE_SETTLE_S)
    applier.round()
    assert tainted(api) == []
    cards = node_cards(existing_slices(api, NODE))[NODE]  # type: ignore[arg-type]
    assert cards[0].mig == () and cards[0].health is Health.HEALTHY
    assert [(m.profile.name, m.start) for m in cards[1].mig] == [("3g.40gb", 4)]
    counters = [s for s in existing_slices(api, NODE)  # type: ignore[arg-type]
                if s["spec"].get("sharedCounters")]
    assert [c["name"] for c in counters[0]["spec"]["sharedCounters"]] == ["gpu-1"]
    assert phase(api, CARDS[1].uuid) == "Applied"


def test_a_card_a_claim_holds_is_blocked_with_no_fence_left() -> None:
    clock = ManualClock()
    api, applier = setup(clock)
    api.add(RESOURCE_CLAIMS.path(), {  # the list is cluster-wide
        "metadata": {"name": "whole", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}}}})
    want(api, CARDS[0].uuid, Placed(4, P3))
    for _ in range(3):
        applier.round()
        clock.advance(FENCE_SETTLE_S)
    assert phase(api, CARDS[0].uuid) == "Blocked"
    assert tainted(api) == []
    assert node_cards(existing_slices(api, NODE))[NODE][0].mig == ()  # type: ignore[arg-type]


def test_a_restarted_applier_reads_the_fence_back_and_settles_again() -> None:
    clock = ManualClock()
    api, applier = setup(clock)
    want(api, CARDS[1].uuid, Placed(4, P3))
    applier.round()
    node = api.get(NODES.path(name=NODE))
    again = mig_agent.fake_dra_applier(api, node, lambda step: None)  # type: ignore[arg-type]
    assert again is not None
    again.clock = clock
    clock.advance(FENCE_SETTLE_S - 1)
    again.round()  # settles from its own start, not the killed one's
    assert tainted(api) == ["gpu-1"]
    clock.advance(FENCE_SETTLE_S)
    again.round()
    assert tainted(api) == [] and phase(api, CARDS[1].uuid) == "Applied"


def test_the_dra_agents_fence_is_read_back_from_its_slices() -> None:
    api = MemoryApi()
    publish_node_slices(api, NODE, with_fences(CARDS, {CARDS[1].uuid}))  # type: ignore[arg-type]
    fence = SliceFence(api, NODE, lambda: None)  # type: ignore[arg-type]
    fence.load()
    assert fence.fenced(CARDS) == {CARDS[1].uuid}
    fence.set(CARDS[1], None)
    assert fence.current() == frozenset()


class NoPods:
    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    on_node = live_on_node = pending_on_node


def test_the_dra_agent_applies_a_layout_through_its_own_seam() -> None:
    """The agent in DRA mode (`DraNode`): the applier runs with the mode's fence and holders,
    fences the card in its slice, carves it and republishes the partitionable devices; a
    restarted mode keeps the fence it finds in its slices (published again tainted)."""
    import shutil
    import tempfile
    from pathlib import Path
    from typing import cast

    from elastic_gpu.agent.backends.fake import FakeBackend
    from elastic_gpu.agent.config import parse_config
    from elastic_gpu.agent.dra.node import DraNode
    from elastic_gpu.agent.miglayout import MigApplier
    from elastic_gpu.agent.runtime import Agent
    from elastic_gpu.kube.sync import SyncKubeClient

    root = Path(tempfile.mkdtemp(prefix="egpu-migdra-", dir="/tmp"))  # short: socket paths
    api = MemoryApi()
    host = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    api.add(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "uid": "uid-1",
        "labels": {GPU_MODE_LABEL: GPU_MODE_DRA, MIG_DYNAMIC_LABEL: "true"}},
        "status": {"capacity": dict(host), "allocatable": dict(host)}})
    config = parse_config({"usage": {"enabled": False}, "syncSeconds": 3600,
                           "healthCheck": {"enabled": False}, "dra": {
                               "enabled": True, "pluginDirectory": str(root / "dra"),
                               "registryDirectory": str(root / "registry"),
                               "cdiDirectory": str(root / "cdi")}})

    def agent() -> Agent:
        return Agent(config, FakeBackend.from_cards(CARDS, NODE), NODE,
                     client=cast(SyncKubeClient, api), pods=NoPods(),
                     plugin_dir=root / "plugins")

    first = agent()
    first.mode.start()
    try:
        assert isinstance(first.mode, DraNode) and first.mode.applies_mig_layouts
        fence, held = first.mode.mig_seam()
        clock = ManualClock()
        applier = MigApplier(cast(SyncKubeClient, api), NODE, first.backend,
                             first.layout_changed, clock=clock, fence=fence, held=held)
        want(api, CARDS[1].uuid, Placed(4, P3))
        applier.round()
        assert tainted(api) == ["gpu-1"]
        again = agent()  # an agent restarted while the card is fenced
        again.mode.start()
        assert tainted(api) == ["gpu-1"]  # its first publish keeps the fence
        clock.advance(FENCE_SETTLE_S)
        assert applier.round() == {CARDS[1].uuid: "Applied"}
        assert tainted(api) == []
        cards = node_cards(existing_slices(api, NODE))[NODE]  # type: ignore[arg-type]
        assert [(m.profile.name, m.start) for m in cards[1].mig] == [("3g.40gb", 4)]
    finally:
        first.mode.stop()
        shutil.rmtree(root, ignore_errors=True)
