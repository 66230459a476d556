"""Fake nodes published as an agent with a given configuration publishes them: what each card
backs (GPUDevice spec.resources), the Node's capacity, the sandbox's cluster file."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from typer.testing import CliRunner

from elastic_gpu.agent.config import AgentConfig, parse_config
from elastic_gpu.agent.devices import build_plans, logical_cards, node_capacity
from elastic_gpu.agent.snapshot import card_offers, snapshot
from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.api.gpudevice import GPUDeviceError, card_from_object, card_to_object
from elastic_gpu.cli.sandbox import app
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.request import PodRequest, container_request
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.devcluster.nodes import (
    ClusterSpecError,
    as_agent_config,
    fake_inventory,
    node_manifest,
    parse_cluster,
)
from elastic_gpu.devcluster.nodes import node_capacity as fake_node_capacity

IX_AGENT = {"resources": {"gpu": "iluvatar.com/gpu"}, "timeSlicing": {"replicas": 4}}
MIXED = Node("m", 1000, 1024, (
    Card(0, "GPU-0", "A100", 81920, mig=(MigInstance(MigProfile(3, 40), "MIG-a", 0),
                                         MigInstance(MigProfile(3, 40), "MIG-b", 4))),
    Card(1, "GPU-1", "A100", 81920, health=Health.UNHEALTHY),
    Card(2, "GPU-2", "A100", 81920)))

CONFIGS: list[dict[str, Any]] = [
    {},
    IX_AGENT,
    {"migStrategy": "mixed"},
    {"migStrategy": "mixed", "timeSlicing": {"replicas": 3}},
    {"resources": {"share": ["tencent.com/vcuda-core", "nano-gpu/gpu-percent"],
                   "memory": ["tencent.com/vcuda-memory", "elasticgpu.io/gpu-memory"]}},
    {"resources": {"share": [], "memory": []}},
]


@pytest.mark.parametrize("raw", CONFIGS)
def test_what_the_cards_back_adds_up_to_the_node_capacity(raw: dict[str, Any]) -> None:
    config = parse_config(raw)
    cards = logical_cards(MIXED.cards, config.splitBoard)
    plans = build_plans(cards, config)
    capacity, _ = node_capacity(cards, config, plans)
    per_card = card_offers(cards, config, plans)
    total: Counter[str] = Counter()
    for offers in per_card.values():
        total.update(offers)
    # kube-scheduler's node-level count: 100 per card, 100 per replica of a time-sliced one
    total[NODE_CORE] = sum(100 * max(1, offers.get(config.resources.gpu, 0))
                           for offers in per_card.values())
    assert {k: str(v) for k, v in total.items()} == capacity
    # and the snapshot's cards carry it, so the GPUDevice spec says it
    snap = snapshot("m", cards, config, tuple(plans))
    assert {c.index: dict(c.offers or {}) for c in snap.node.cards} == per_card


def test_an_ix_node_offers_four_replicas_per_card_and_no_nvidia() -> None:
    config = parse_config(IX_AGENT)
    inventory = fake_inventory("ix", gpus=2, gpu_model="BI-V100", gpu_memory_mib=32768)
    manifest = node_manifest(inventory, config)
    assert manifest["status"]["capacity"]["iluvatar.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in manifest["status"]["capacity"]
    assert fake_node_capacity(inventory, IX_AGENT)["iluvatar.com/gpu"] == "8"
    cards = logical_cards(inventory.cards, config.splitBoard)
    offers = card_offers(cards, config, build_plans(cards, config))
    assert offers[0] == {"iluvatar.com/gpu": 4, "elasticgpu.io/gpu-core": 100,
                         "elasticgpu.io/gpu-memory": 32768}


def test_default_fake_nodes_advertise_mig_instances() -> None:
    node = Node("m", 1000, 1024, MIXED.cards[:1] + MIXED.cards[2:])
    capacity = node_manifest(node)["status"]["capacity"]
    assert capacity["nvidia.com/mig-3g.40gb"] == "2" and capacity["nvidia.com/gpu"] == "1"


def test_gpudevice_spec_resources_round_trip_and_absence_means_unknown() -> None:
    card = Card(0, "GPU-0", "BI-V100", 32768, offers={"iluvatar.com/gpu": 4})
    obj = card_to_object("ix", card)
    assert obj["spec"]["resources"] == {"iluvatar.com/gpu": 4}
    assert card_from_object(obj) == ("ix", card)
    old = card_to_object("ix", Card(0, "GPU-0", "BI-V100", 32768))
    assert "resources" not in old["spec"]
    assert card_from_object(old)[1].offers is None
    for bad in ({"iluvatar.com/gpu": "4"}, {"iluvatar.com/gpu": -1}, ["iluvatar.com/gpu"]):
        obj["spec"]["resources"] = bad
        with pytest.raises(GPUDeviceError, match=r"spec\.resources"):
            card_from_object(obj)


def test_agent_config_in_dict_form_is_validated_with_the_field_named() -> None:
    assert isinstance(as_agent_config(IX_AGENT), AgentConfig)
    with pytest.raises(ConfigError, match=r"timeSlicing\.replicas"):
        as_agent_config({"timeSlicing": {"replicas": 0}})


# ---------------------------------------------------------------------------- cluster file

CLUSTER = {"nodeGroups": [
    {"name": "nv", "count": 2, "gpus": 4},
    {"name": "ix", "count": 1, "gpus": 2, "model": "BI-V100", "memoryMiB": 32768,
     "agentConfig": IX_AGENT},
    {"name": "mig", "count": 1, "gpus": 1, "mig": ["3g.40gb", "3g.40gb"]},
]}


def test_cluster_file_makes_groups_of_nodes_each_with_its_agent() -> None:
    nv, ix, mig = parse_cluster(CLUSTER)
    assert [n.name for n in nv.inventories()] == ["nv-000", "nv-001"]
    assert nv.agent_config is None and ix.agent_config is not None
    (ix_node,) = ix.inventories()
    assert ix_node.cards[1].model == "BI-V100" and ix_node.cards[1].memory_mib == 32768
    assert node_manifest(ix_node, ix.agent_config)["status"]["capacity"]["iluvatar.com/gpu"] == "8"
    (mig_node,) = mig.inventories()
    # NVIDIA's placement slots: a 3g.40gb starts at 0 or 4 (not at compute slice 3)
    assert [(m.profile.name, m.start) for m in mig_node.cards[0].mig] == [("3g.40gb", 0),
                                                                         ("3g.40gb", 4)]
    # published and read back, an engine sends IX pods to the IX node only
    nodes = []
    for group in (nv, ix):
        for inv in group.inventories():
            config = group.agent_config or as_agent_config(None)
            cards = logical_cards(inv.cards, config.splitBoard)
            snap = snapshot(inv.name, cards, config)
            nodes.append(Node(inv.name, 64000, 1 << 18, snap.node.cards))
    pod = PodRequest("p", containers=(container_request("c", {"limits": {
        "iluvatar.com/gpu": "1"}}),))
    assert Engine(nodes).filter(pod).feasible == ["ix-000"]


@pytest.mark.parametrize(("change", "words"), [
    ({"count": "2"}, "nodeGroups[0] (nv).count='2': must be a whole number"),
    ({"gpus": 65}, "gpus=65"),
    ({"name": "Bad_Name"}, "nodeGroups[0].name='Bad_Name'"),
    ({"extra": 1}, "unknown key(s) ['extra']"),
    ({"mig": ["0g.0gb"]}, "mig[0]='0g.0gb'"),
    ({"mig": ["4g.40gb", "4g.40gb"]}, "more than 7 compute slices"),
    ({"chipsPerBoard": 9}, "nodeGroups[0] (nv).chipsPerBoard=9: must be a whole number 1-8"),
    ({"chipsPerBoard": 0}, "chipsPerBoard=0: must be a whole number 1-8"),
    ({"chipsPerBoard": "2"}, "chipsPerBoard='2': must be a whole number"),
    ({"chipsPerBoard": 2, "gpus": 33}, "chipsPerBoard=2: gpus x chipsPerBoard = 66 chips; "
                                       "at most 64 per node"),
    ({"chipsPerBoard": 2, "mig": ["3g.40gb"]}, "mig=['3g.40gb']: MIG instances are carved on "
                                               "single-chip cards only"),
    ({"agentConfig": {"timeSlicing": {"replicas": 0}}}, "timeSlicing.replicas"),
    ({"agentConfig": "ix"}, "agentConfig='ix': must be a mapping"),
])
def test_cluster_file_errors_name_field_value_and_rule(change: dict[str, Any], words: str) -> None:
    group = {"name": "nv", "count": 1, "gpus": 1, **change}
    with pytest.raises(ClusterSpecError) as err:
        parse_cluster({"nodeGroups": [group]}, "c.yaml")
    assert words in str(err.value)
    assert str(err.value).startswith("c.yaml")


def test_cluster_file_shape_errors() -> None:
    with pytest.raises(ClusterSpecError, match="exactly one key, nodeGroups"):
        parse_cluster({"nodes": []})
    with pytest.raises(ClusterSpecError, match="non-empty list"):
        parse_cluster({"nodeGroups": []})
    with pytest.raises(ClusterSpecError, match="used by an earlier group"):
        parse_cluster({"nodeGroups": [{"name": "a", "count": 1, "gpus": 1}] * 2})


def test_sandbox_cli_refuses_bad_cluster_and_agent_files(tmp_path: Any) -> None:
    runner = CliRunner(env={"COLUMNS": "300"})
    # --bin-dir names an empty folder: whatever happens, no control plane can start here
    no_bins = ["--bin-dir", str(tmp_path / "empty")]
    bad = tmp_path / "c.yaml"
    bad.write_text("nodeGroups:\n- {name: ix, count: 1, gpus: 2, agentConfig: {migStrategy: all}}\n")
    result = runner.invoke(app, ["up", "--cluster", str(bad), "--kubeconfig",
                                 str(tmp_path / "kc"), "--state-dir", str(tmp_path / "s"),
                                 *no_bins])
    assert result.exit_code == 2 and "agentConfig" in result.output
    agent = tmp_path / "a.yaml"
    agent.write_text("timeSlicing: {replicas: 0}\n")
    result = runner.invoke(app, ["up", "--gpu-nodes", "1", "--agent-config", str(agent),
                                 "--kubeconfig", str(tmp_path / "kc"),
                                 "--state-dir", str(tmp_path / "s"), *no_bins])
    assert result.exit_code == 2 and "timeSlicing.replicas" in result.output
    good = tmp_path / "g.yaml"
    good.write_text("nodeGroups:\n- {name: nv, count: 1, gpus: 1}\n")
    result = runner.invoke(app, ["up", "--cluster", str(good), "--gpu-nodes", "1",
                                 "--kubeconfig", str(tmp_path / "kc"),
                                 "--state-dir", str(tmp_path / "s"), *no_bins])
    assert result.exit_code == 2 and "leave out --gpu-nodes" in result.output
    # a good file gets as far as the binaries (which are missing here)
    result = runner.invoke(app, ["up", "--cluster", str(good), "--kubeconfig",
                                 str(tmp_path / "kc"), "--state-dir", str(tmp_path / "s"),
                                 *no_bins])
    assert result.exit_code == 1 and "hack/ensure-k8s.sh" in result.output


# ---------------------------------------------------------------------------- multi-chip boards

# The IX plugin's ConfigMap data verbatim (ix-device-plugin.yaml's `ix-config`), time-sliced.
IX_CONFIGMAP = {"ix-config": 'version: "4.2.0"\nflags:\n  splitboard: false\nsharing:\n'
                             '  timeSlicing:\n    replicas: 4\n'}
IX_CONFIGMAP_SPLIT = {"ix-config": IX_CONFIGMAP["ix-config"].replace("false", "true")}


def _published(group: Any) -> list[Any]:
    """Each node of the group as the agent's fake backend publishes it (publish_fake_node's
    path without the API: FakeBackend.from_cards, discover, the config's shaping)."""
    from elastic_gpu.agent.backends.fake import FakeBackend
    from elastic_gpu.agent.snapshot import discover

    config = group.agent_config or as_agent_config(None)
    return [discover(FakeBackend.from_cards(inv.cards, inv.name), config, inv.name)
            for inv in group.inventories()]


def test_two_chip_boards_follow_the_ix_configmaps_splitboard_and_replicas() -> None:
    whole, split = parse_cluster({"nodeGroups": [
        {"name": "ix", "count": 1, "gpus": 2, "chipsPerBoard": 2, "model": "BI-V150",
         "memoryMiB": 32768, "agentConfig": IX_CONFIGMAP},
        {"name": "ixs", "count": 2, "gpus": 2, "chipsPerBoard": 2, "model": "BI-V150",
         "memoryMiB": 32768, "agentConfig": IX_CONFIGMAP_SPLIT},
    ]})
    (ix_node,) = whole.inventories()
    # 2 boards of 2 chips: 4 chips, numbered as the fake backend's boards: section numbers them
    assert [(c.index, c.uuid, c.board) for c in ix_node.cards] == [
        (0, "GPU-fake-ix-000-0-chip0", "GPU-fake-ix-000-0"),
        (1, "GPU-fake-ix-000-0-chip1", "GPU-fake-ix-000-0"),
        (2, "GPU-fake-ix-000-1-chip0", "GPU-fake-ix-000-1"),
        (3, "GPU-fake-ix-000-1-chip1", "GPU-fake-ix-000-1")]
    # splitboard false: a board is one card (both chips together, memory summed), 4 replicas
    # each: 2 boards x 4 = 8. The IX form advertises nothing else.
    (snap,) = _published(whole)
    assert dict(snap.capacity) == {"iluvatar.com/gpu": "8", NODE_CORE: "800"}
    assert [(c.index, c.uuid, c.memory_mib, dict(c.offers or {})) for c in snap.node.cards] == [
        (0, "GPU-fake-ix-000-0", 65536, {"iluvatar.com/gpu": 4}),
        (2, "GPU-fake-ix-000-1", 65536, {"iluvatar.com/gpu": 4})]
    # splitboard true: each chip is a card: 4 chips x 4 = 16.
    for snap in _published(split):
        assert dict(snap.capacity) == {"iluvatar.com/gpu": "16", NODE_CORE: "1600"}
        assert [c.memory_mib for c in snap.node.cards] == [32768] * 4
    # The Node object the sandbox creates says the same before the agent's patch.
    assert node_manifest(ix_node, whole.agent_config)["status"]["capacity"][
        "iluvatar.com/gpu"] == "8"
    (first_split, _) = split.inventories()
    assert node_manifest(first_split, split.agent_config)["status"]["capacity"][
        "iluvatar.com/gpu"] == "16"
    # Read back by the scheduler's engine: IX pods go to the boards, shares do not (the IX
    # form sells none), whatever the boards' card indexes (0 and 2 unsplit).
    plain = parse_cluster({"nodeGroups": [{"name": "nv", "count": 1, "gpus": 2}]})[0]
    nodes = [Node(s.node.name, 64000, 1 << 18, s.node.cards)
             for group in (whole, plain) for s in _published(group)]
    for resource, count, where in (("iluvatar.com/gpu", "2", ["ix-000"]),
                                   ("elasticgpu.io/gpu-core", "30", ["nv-000"])):
        pod = PodRequest("p", containers=(container_request("c", {"limits": {
            resource: count}}),))
        assert Engine(nodes).filter(pod).feasible == where


def test_boards_under_the_default_agent_sell_shares_per_board() -> None:
    """chipsPerBoard with the agent's own defaults: an unsplit board is one card of 100 %."""
    (group,) = parse_cluster({"nodeGroups": [
        {"name": "b", "count": 1, "gpus": 3, "chipsPerBoard": 2, "memoryMiB": 16384}]})
    (snap,) = _published(group)
    assert dict(snap.capacity) == {"nvidia.com/gpu": "3", "elasticgpu.io/gpu-core": "300",
                                   "elasticgpu.io/gpu-memory": str(3 * 2 * 16384),
                                   # a board is one card of its model to the scheduler's
                                   # TFLOPS share too (an A100's 312)
                                   "elasticgpu.io/gpu-tflops": str(3 * 312),
                                   NODE_CORE: "300"}


def test_cluster_file_is_read_with_the_agent_configs_yaml_rules(tmp_path: Any) -> None:
    from elastic_gpu.devcluster.nodes import load_cluster

    path = tmp_path / "c.yaml"
    # YAML 1.1 would read `yes` as true; the agent's own file reader refuses it, so does this
    path.write_text('nodeGroups:\n- name: ix\n  count: 1\n  gpus: 1\n  chipsPerBoard: 2\n'
                    '  agentConfig: {version: "4.2.0", flags: {splitboard: yes}}\n')
    with pytest.raises(ClusterSpecError, match=r"flags\.splitboard: got 'yes' \(a string\)"):
        load_cluster(path)
    path.write_text("nodeGroups:\n- {name: a, count: 010, gpus: 1}\n")
    with pytest.raises(ClusterSpecError, match=r"\(a\)\.count='010': must be a whole number"):
        load_cluster(path)
    path.write_text("nodeGroups:\n- {name: a, count: 1, count: 2, gpus: 1}\n")
    with pytest.raises(ClusterSpecError, match="given twice"):
        load_cluster(path)


def test_fake_inventory_of_boards_is_the_cluster_files() -> None:
    """`fake_gpu_nodes(..., chips_per_board=2)` makes the same nodes as a cluster file's group."""
    (group,) = parse_cluster({"nodeGroups": [
        {"name": "ix", "count": 1, "gpus": 3, "chipsPerBoard": 2, "model": "BI-V150",
         "memoryMiB": 32768}]})
    (from_group,) = group.inventories()
    assert fake_inventory("ix-000", gpus=3, gpu_model="BI-V150", gpu_memory_mib=32768,
                          chips_per_board=2) == from_group
    assert len(from_group.cards) == 6 and {c.board for c in from_group.cards} == {
        "GPU-fake-ix-000-0", "GPU-fake-ix-000-1", "GPU-fake-ix-000-2"}
    with pytest.raises(ValueError, match="chips per board 0"):
        fake_inventory("x", gpus=1, chips_per_board=0)
