"""Fake nodes in DRA mode: their Node (no device-plugin GPU names, the node-level count), the
inventory they carry for their stand-in agent, and how the sandbox picks them."""

from __future__ import annotations

import json
from typing import cast

import pytest

from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.core.dra.devices import device_table, node_slices
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.mig.layout import Placement, check_layout
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import accounting_allocatable
from elastic_gpu.devcluster import dra_nodes, nodes
from elastic_gpu.kube.resources import NODES, RESOURCE_SLICES
from elastic_gpu.kube.sync import SyncKubeClient


def test_a_dra_node_advertises_only_the_node_level_count_and_carries_its_inventory() -> None:
    inv = dra_nodes.carve(dra_nodes.as_dra(nodes.fake_inventory("d0", gpus=2)), 1,
                          dra_nodes.SANDBOX_MIG_LAYOUT)
    manifest = nodes.node_manifest(inv)
    assert manifest["metadata"]["labels"][GPU_MODE_LABEL] == "dra"
    gpu = {k: v for k, v in manifest["status"]["allocatable"].items()
           if k not in ("cpu", "memory", "pods")}
    # 100 per card, the quota's accounting names (DynamicResources checks them), no
    # nvidia.com/gpu or gpu-core
    assert gpu == {NODE_CORE: "200", **accounting_allocatable()}
    text = manifest["metadata"]["annotations"][dra_nodes.FAKE_INVENTORY_ANNOTATION]
    assert dra_nodes.cards_from_json(text) == inv.cards
    # the slices its stand-in agent publishes: one shareable card, four MIG devices
    # placed by NVIDIA's rules (a 2g.20gb may not start at slot 3): 2g@0, 1g@2, 1g@3, 3g@4
    assert sorted(device_table(inv.cards)) == [
        "gpu-0", "gpu-1-mig-0-2g-20gb", "gpu-1-mig-2-1g-10gb", "gpu-1-mig-3-1g-10gb",
        "gpu-1-mig-4-3g-40gb"]
    assert len(node_slices("d0", inv.cards, 1)) == 2
    assert nodes.published_cards(inv) == 0  # no GPUDevices for the extender to wait for


def test_dra_nodes_are_the_last_ones_and_the_first_of_them_has_mig() -> None:
    invs = dra_nodes.with_dra_nodes(nodes.uniform_inventories(3, gpus=2), 2)
    assert [GPU_MODE_LABEL in i.labels for i in invs] == [False, True, True]
    assert invs[1].cards[1].mig and not invs[1].cards[0].mig and not invs[2].cards[1].mig
    with pytest.raises(ValueError, match="there are 3"):
        dra_nodes.with_dra_nodes(nodes.uniform_inventories(3), 4)


def test_a_cluster_file_group_may_be_dra() -> None:
    groups = nodes.parse_cluster({"nodeGroups": [
        {"name": "d", "count": 1, "gpus": 1, "gpuMode": "dra", "mig": ["1g.10gb"]},
        {"name": "p", "count": 1, "gpus": 1}]})
    assert [GPU_MODE_LABEL in g.inventories()[0].labels for g in groups] == [True, False]
    with pytest.raises(nodes.ClusterSpecError, match="gpuMode='cdi'"):
        nodes.parse_cluster({"nodeGroups": [{"name": "d", "count": 1, "gpus": 1,
                                             "gpuMode": "cdi"}]})


@pytest.mark.parametrize("gpu_mode", ["device-plugin", "dra"])
def test_a_kwok_nodes_manifest_is_the_status_the_agents_capacity_patch_leaves(
        gpu_mode: str) -> None:
    """One way for the quota's accounting names: a kwok node is created with the status the
    agent's capacity patch would write (`agent.node_status.status_patch` finds nothing to change),
    in either mode, so the sandbox has nothing to patch afterwards (`enable_dra`)."""
    from elastic_gpu.agent.config import parse_config
    from elastic_gpu.agent.devices import logical_cards
    from elastic_gpu.agent.dra.node import dra_capacity as agent_dra_capacity
    from elastic_gpu.agent.node_status import status_patch

    inv = nodes.fake_inventory("n0", gpus=2)
    if gpu_mode == "dra":
        inv = dra_nodes.as_dra(inv)
    manifest = nodes.node_manifest(inv)
    if gpu_mode == "dra":
        cards = {lc.index: lc for lc in logical_cards(inv.cards, False)}
        capacity = allocatable = agent_dra_capacity(cards)
        config = parse_config({"dra": {"enabled": True}})
    else:
        config = nodes.FAKE_NODE_AGENT_CONFIG
        capacity, allocatable = nodes.gpu_status(inv, config)
    assert status_patch(manifest["status"], capacity, allocatable, config) is None
    for field in ("capacity", "allocatable"):
        assert accounting_allocatable().items() <= manifest["status"][field].items()


def test_the_fake_inventory_is_in_gpudevice_spec_form_and_the_older_form_still_reads() -> None:
    from elastic_gpu.api.gpudevice import card_spec

    inv = dra_nodes.carve(dra_nodes.as_dra(nodes.fake_inventory("d0", gpus=2)), 1,
                          dra_nodes.SANDBOX_MIG_LAYOUT)
    text = nodes.node_manifest(inv)["metadata"]["annotations"][
        dra_nodes.FAKE_INVENTORY_ANNOTATION]
    assert json.loads(text) == [card_spec("d0", card) for card in inv.cards]
    older = json.dumps([{"index": c.index, "uuid": c.uuid, "model": c.model,
                         "memoryMiB": c.memory_mib, "computeMilli": c.compute_milli,
                         "mig": [{"profile": i.profile.name, "uuid": i.uuid, "start": i.start}
                                 for i in c.mig]} for c in inv.cards])
    assert dra_nodes.cards_from_json(older) == dra_nodes.cards_from_json(text) == inv.cards
    with pytest.raises(ValueError, match="memoryMiB"):
        dra_nodes.cards_from_json('[{"index": 0, "uuid": "u", "model": "m"}]')


def test_a_kwok_dra_nodes_gpu_names_are_the_dra_agents() -> None:
    from elastic_gpu.agent.dra.node import dra_capacity

    inv = dra_nodes.as_dra(nodes.fake_inventory("d0", gpus=3))
    assert nodes.gpu_status(inv) == (dra_capacity(inv.cards), dra_capacity(inv.cards))
    assert nodes.node_capacity(inv) == {"cpu": "96000m", "memory": "786432Mi", "pods": "256",
                                        NODE_CORE: "300"}


@pytest.mark.parametrize(("model", "mig", "fits"), [
    ("A30-24GB", ["2g.12gb", "2g.12gb"], True),
    ("A30-24GB", ["2g.12gb", "1g.6gb", "1g.6gb", "1g.6gb"], False),  # 5 of an A30's 4
    ("A100-SXM4-80GB", ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], True),
    ("A100-SXM4-80GB", ["4g.40gb", "4g.40gb"], False),  # 8 of 7
])
def test_a_groups_mig_layout_fits_its_models_slices(model: str, mig: list[str],
                                                    fits: bool) -> None:
    group = {"name": "m", "count": 1, "gpus": 1, "model": model, "mig": mig}
    if fits:
        nodes.parse_cluster({"nodeGroups": [group]})
        return
    with pytest.raises(nodes.ClusterSpecError, match=f"compute slices on one {model} card"):
        nodes.parse_cluster({"nodeGroups": [group]})


def test_a_groups_mig_layout_is_placed_by_nvidias_rules() -> None:
    # 7 compute slices, but 9 of 8 placement slots: no card can carry it
    group = {"name": "m", "count": 1, "gpus": 1, "model": "A100-SXM4-80GB",
             "mig": ["3g.40gb", "3g.40gb", "1g.10gb"]}
    with pytest.raises(nodes.ClusterSpecError, match="NVIDIA's placement rules"):
        nodes.parse_cluster({"nodeGroups": [group]})
    group["mig"] = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    (inv,) = nodes.parse_cluster({"nodeGroups": [group]})[0].inventories()
    model = mig_model("A100-SXM4-80GB")
    assert model is not None
    for card in inv.cards:
        layout = [Placement(i.profile, i.start) for i in card.mig]
        assert check_layout(model, layout) is None
        assert [i.profile.name for i in card.mig] == group["mig"]


def _dra_agent_cards(inv: Node, config: AgentConfig) -> list[Card]:
    """The cards a real DRA agent with `config` publishes for `inv`'s chips (`DraNode`
    publishes its state's logical cards, discovered from the backend)."""
    from elastic_gpu.agent.backends.fake import FakeBackend
    from elastic_gpu.agent.snapshot import discover

    return [lc.card for lc in discover(FakeBackend.from_cards(inv.cards, inv.name), config,
                                       inv.name).cards]


def _published_devices(api: MemoryApi) -> list[str]:
    slices, _ = api.list(RESOURCE_SLICES.path())
    return sorted(d["name"] for s in slices for d in s["spec"]["devices"])


@pytest.mark.parametrize("split", [False, True])
def test_a_kwok_dra_node_of_boards_offers_what_a_dra_agent_with_its_config_offers(
        split: bool) -> None:
    """Two boards of two chips: one card per board, as a DRA agent publishes them, unless
    the config splits boards (then one per chip); the Node's count, the cards it carries for
    its stand-in agent, the slices registration and the slice sync publish all agree."""
    from elastic_gpu.agent.config import parse_config
    from elastic_gpu.agent.dra.node import dra_capacity

    inv = dra_nodes.as_dra(nodes.fake_inventory("d0", gpus=2, chips_per_board=2))
    config = parse_config({"splitBoard": split, "dra": {"enabled": True}})
    agent = _dra_agent_cards(inv, config)
    assert len(agent) == (4 if split else 2)
    assert nodes.gpu_status(inv, config) == (dra_capacity(agent), dra_capacity(agent))
    manifest = nodes.node_manifest(inv, config)
    assert manifest["status"]["allocatable"][NODE_CORE] == str(100 * len(agent))
    text = manifest["metadata"]["annotations"][dra_nodes.FAKE_INVENTORY_ANNOTATION]
    assert list(dra_nodes.cards_from_json(text)) == agent

    api = MemoryApi()
    nodes.register_fake_node(cast(SyncKubeClient, api), inv, config)
    assert _published_devices(api) == sorted(device_table(agent))
    for item in api.list(RESOURCE_SLICES.path())[0]:  # kubelet's restart deletes them
        api.delete(RESOURCE_SLICES.path(name=item["metadata"]["name"]))
    assert dra_nodes.DraSliceSync(cast(SyncKubeClient, api)).sync() == 1
    assert _published_devices(api) == sorted(device_table(agent))


def test_re_registering_a_dra_node_updates_its_gpu_names_by_the_agents_rule() -> None:
    """A node that was a device-plugin node becomes DRA: its device-plugin GPU names go, the
    node-level count and the accounting names come, as the agent's `status_patch` writes
    them; a name that is not ours (another vendor's device plugin) stays."""
    from elastic_gpu.agent.node_status import status_patch

    api = MemoryApi()
    plain = nodes.fake_inventory("d0", gpus=2)
    before = nodes.node_manifest(plain)
    foreign = {"example.com/fpga": "2"}
    api.add(NODES.path(), {**before, "status": {
        field: {**before["status"][field], **foreign} for field in ("capacity", "allocatable")}})
    assert "nvidia.com/gpu" in before["status"]["capacity"]

    inv = dra_nodes.as_dra(plain)
    config = nodes.FAKE_NODE_AGENT_CONFIG
    nodes.register_fake_node(cast(SyncKubeClient, api), inv, config)
    status = api.get(NODES.path(name="d0"))["status"]
    want = nodes.node_manifest(inv, config)["status"]
    for field in ("capacity", "allocatable"):
        assert status[field] == {**want[field], **foreign}
    gpu = nodes.gpu_status(inv, config)
    assert status_patch(status, *gpu, config) is None  # nothing left for the agent to change
    assert _published_devices(api) == ["gpu-0", "gpu-1"]
