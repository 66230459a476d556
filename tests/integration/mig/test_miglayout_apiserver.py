"""The MigLayout CRD on the real kube-apiserver (issue 42): a card's wanted layout is served,
read back as the agent reads it, and what the schema can check alone is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from elastic_gpu.api import miglayout as api
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.resources import MigProfile

pytestmark = pytest.mark.integration


@pytest.fixture
def crds(k8s_cluster: Any) -> Any:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())  # what the sandbox installs
    return k8s_cluster


def test_a_layout_is_served_read_printed_and_keeps_its_card(crds: Any) -> None:
    body = api.layout_spec("gpu-node-1", "GPU-IT-0A0A", [Placed(0, MigProfile.parse("3g.40gb")),
                                                         Placed(4, MigProfile.parse("1g.10gb"))])
    name = body["metadata"]["name"]
    crds.kubectl("create", "-f", "-", input=json.dumps(body))
    try:
        obj = json.loads(crds.kubectl("get", api.SHORT, name, "-o", "json").stdout)
        layout = api.layout_from_object(obj)
        assert (layout.node, layout.card_uuid, layout.generation) == \
            ("gpu-node-1", "GPU-IT-0A0A", 1)
        assert [str(p) for p in layout.instances] == ["3g.40gb@0", "1g.10gb@4"]
        out = crds.kubectl("get", api.SHORT, name).stdout.split("\n")
        assert out[0].split() == ["NAME", "NODE", "CARD", "PHASE", "AGE"]
        moved = crds.kubectl("patch", api.SHORT, name, "--type=merge",
                             "-p", '{"spec":{"cardUUID":"GPU-other"}}', check=False)
        assert moved.returncode != 0 and "nodeName and cardUUID are immutable" in moved.stderr
    finally:
        crds.kubectl("delete", api.SHORT, name, check=False)


@pytest.mark.parametrize(("instance", "words"), [
    ({"profile": "nvidia.com/mig-3g.40gb", "start": 0}, "spec.instances[0].profile"),
    ({"profile": "3g.40gb", "start": 8}, "spec.instances[0].start"),
    ({"profile": "3g.40gb"}, "spec.instances[0].start: Required value"),
])
def test_what_the_schema_can_say_alone_is_refused(crds: Any, instance: dict[str, Any],
                                                  words: str) -> None:
    body = api.layout_spec("gpu-node-1", "GPU-IT-BAD", [])
    body["spec"]["instances"] = [instance]
    result = crds.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0 and words in result.stderr, result.stderr


def test_the_applier_reads_its_nodes_layouts_from_a_watch_not_a_list(crds: Any) -> None:
    """`agent.miglayout.LayoutCache`: the node's MigLayouts kept by a watch (another node's
    left out, a change seen), which the applier reads instead of listing every round."""
    from pathlib import Path

    from egpu_testing.waiting import wait_for
    from elastic_gpu.agent.backends.fake import FakeBackend
    from elastic_gpu.agent.miglayout import LayoutCache, MigApplier
    from elastic_gpu.kube.resources import MIG_LAYOUTS
    from elastic_gpu.kube.sync import SyncKubeClient

    class NoLayoutList(SyncKubeClient):
        def list(self, path: str, params: Any = None) -> Any:
            assert path != MIG_LAYOUTS.path(), "the applier listed MigLayouts"
            return super().list(path, params)

    mine = api.layout_spec("watch-node", "GPU-W-1", [Placed(4, MigProfile.parse("3g.40gb"))])
    other = api.layout_spec("other-node", "GPU-W-2", [])
    client = NoLayoutList.from_config(Path(crds.kubeconfig), field_manager="egpu-test")
    cache = LayoutCache(client, "watch-node")
    cache.start()
    try:
        for body in (mine, other):
            crds.kubectl("create", "-f", "-", input=json.dumps(body))
        wait_for("the node's layout in the cache", lambda: [
            o["metadata"]["name"] for o in cache.objects() or []] == [mine["metadata"]["name"]])
        applier = MigApplier(client, "watch-node", FakeBackend.from_cards([]),
                             lambda: None, cache=cache)
        assert [layout.card_uuid for layout in applier.layouts()] == ["GPU-W-1"]
        crds.kubectl("patch", api.SHORT, mine["metadata"]["name"], "--type=merge",
                     "-p", '{"spec":{"instances":[]}}')
        wait_for("the change seen", lambda: [
            list(layout.instances) for layout in applier.layouts()] == [[]])
    finally:
        cache.stop()
        client.close()
        for body in (mine, other):
            crds.kubectl("delete", api.SHORT, body["metadata"]["name"], check=False)


def test_the_kwok_stand_in_applies_layouts_from_one_watch(crds: Any) -> None:
    """The sandbox's stand-in appliers (`devcluster.mig_agent.MigAgents`, started as
    allocation-sync starts them) read every node's MigLayouts from one watch, never a LIST per
    node and pass, and still carry a layout out: fence, settle, carve, publish, unfence."""
    from pathlib import Path

    from egpu_testing.waiting import wait_for
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.agent.deviceplugin.publish import publish_fake_node
    from elastic_gpu.api import gpudevice as gd
    from elastic_gpu.devcluster.mig_agent import MigAgents
    from elastic_gpu.devcluster.nodes import node_manifest, parse_cluster
    from elastic_gpu.kube.resources import GPUDEVICES, MIG_LAYOUTS, NODES
    from elastic_gpu.kube.sync import SyncKubeClient

    class NoLayoutList(SyncKubeClient):
        def list(self, path: str, params: Any = None) -> Any:
            assert path != MIG_LAYOUTS.path(), "the stand-in listed MigLayouts"
            return super().list(path, params)

    client = NoLayoutList.from_config(Path(crds.kubeconfig), field_manager="egpu-test")
    ensure_crd(crds.kube())
    (group,) = parse_cluster({"nodeGroups": [{
        "name": "mig-watch", "count": 1, "gpus": 2, "model": "A100-SXM4-80GB",
        "memoryMiB": 81920, "migDynamic": True}]})
    (inventory,) = group.inventories()
    card = inventory.cards[1].uuid
    body = api.layout_spec(inventory.name, card, [Placed(4, MigProfile.parse("3g.40gb"))])
    agents = MigAgents(client)
    try:
        client.create(NODES.path(), node_manifest(inventory))
        publish_fake_node(client, inventory)
        agents.start()
        assert agents.cache is not None
        wait_for("the watch's first list", lambda: agents.cache.objects() is not None)
        crds.kubectl("create", "-f", "-", input=json.dumps(body))

        def applied() -> bool:
            agents.sync()
            obj = client.get(MIG_LAYOUTS.path(name=body["metadata"]["name"]))
            return (obj.get("status") or {}).get("phase") == "Applied"

        wait_for("the layout applied by the stand-in", applied)
        published = gd.card_from_object(client.get(GPUDEVICES.path(
            name=gd.object_name(inventory.name, 1))))[1]
        assert [(m.profile.name, m.start) for m in published.mig] == [("3g.40gb", 4)]
    finally:
        agents.close()
        crds.kubectl("delete", api.SHORT, body["metadata"]["name"], check=False)
        crds.kubectl("delete", "gpudevices", "-l", f"{gd.NODE_LABEL}={inventory.name}",
                     check=False)
        crds.kubectl("delete", "node", inventory.name, check=False)
        client.close()


def test_a_gpudevice_keeps_the_cards_mig_mode(crds: Any) -> None:
    """`spec.migMode` is in the GPUDevice schema (not pruned): a card in MIG mode with no
    instance, its mode off pending a reset, reads back as such (the planner's carved card)."""
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.api import gpudevice as gd
    from elastic_gpu.core.model import Card, MigMode
    from elastic_gpu.kube.resources import GPUDEVICES

    ensure_crd(crds.kube())
    card = Card(0, "GPU-MODE-0", "NVIDIA A100-SXM4-80GB", 81920,
                mig_mode=MigMode(current=True, pending=False))
    body = gd.card_to_object("mode-node", card)
    client = crds.kube()
    client.create(GPUDEVICES.path(), body)
    try:
        read = gd.card_from_object(client.get(GPUDEVICES.path(name=body["metadata"]["name"])))[1]
        assert read.mig_mode == MigMode(current=True, pending=False) and read.mig_enabled
    finally:
        crds.kubectl("delete", "gpudevices", body["metadata"]["name"], check=False)
