import pytest
import yaml

from elastic_gpu.core.model import Card, Health, Node
from elastic_gpu.core.resources import GPU_CORE, GPU_MEMORY
from elastic_gpu.devcluster import kwok
from elastic_gpu.devcluster.binaries import BINARIES, find_bin_dir
from elastic_gpu.devcluster.controlplane import scheduler_names
from elastic_gpu.devcluster.errors import MissingBinariesError
from elastic_gpu.devcluster.nodes import (
    NodesCsvError,
    fake_inventory,
    node_capacity,
    node_manifest,
    read_nodes_csv,
    uniform_inventories,
)


def test_capacity_advertises_every_gpu_unit():
    cap = node_capacity(fake_inventory("n", gpus=4, gpu_memory_mib=16384))
    assert cap["nvidia.com/gpu"] == "4"
    assert cap[GPU_CORE] == "400"
    assert cap[GPU_MEMORY] == str(4 * 16384)


def test_unhealthy_cards_are_not_advertised():
    cards = (Card(0, "a", "T4", 16384), Card(1, "b", "T4", 16384, health=Health.UNHEALTHY))
    cap = node_capacity(Node("n", 1000, 1024, cards))
    assert cap["nvidia.com/gpu"] == "1"
    assert cap[GPU_CORE] == "100"


def test_manifest_is_kwok_managed_and_allocatable_equals_capacity():
    m = node_manifest(fake_inventory("gpu-1", gpus=2, gpu_model="A100 80GB"))
    assert m["metadata"]["annotations"][kwok.FAKE_NODE_ANNOTATION] == "fake"
    assert m["metadata"]["labels"]["nvidia.com/gpu.product"] == "A100-80GB"
    assert m["status"]["allocatable"] == m["status"]["capacity"]


def test_uniform_names_are_sortable_and_unique():
    names = [n.name for n in uniform_inventories(120)]
    assert names == sorted(names) and len(set(names)) == 120
    assert names[0] == "gpu-node-000"


def test_nodes_csv_keeps_gpu_rows(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                    "openb-node-0000,32000,262144,0,\n"
                    "openb-node-0001,96000,786432,8,G2\n"
                    "openb-node-0002,64000,524288,2,T4\n")
    nodes = read_nodes_csv(path)
    assert [n.name for n in nodes] == ["openb-node-0001", "openb-node-0002"]
    assert nodes[0].gpu_count == 8 and nodes[0].cpu_milli == 96000
    assert nodes[1].cards[0].model == "T4" and nodes[1].cards[0].memory_mib == 16384
    assert len(read_nodes_csv(path, limit=1)) == 1


def test_nodes_csv_errors_name_the_problem(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("sn,cpu,gpu\nx,1,1\n")
    with pytest.raises(NodesCsvError, match="missing column"):
        read_nodes_csv(path)
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nx,lots,1,1,T4\n")
    with pytest.raises(NodesCsvError, match=r"bad.csv:2"):
        read_nodes_csv(path)


def test_kwok_config_has_options_and_stages():
    docs = list(yaml.safe_load_all(kwok.kwok_config_yaml()))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert docs[0]["options"]["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"
    kinds = {(d["spec"]["resourceRef"]["kind"], d["metadata"]["name"]) for d in docs[1:]}
    assert ("Node", "node-initialize") in kinds and ("Pod", "pod-running") in kinds
    assert ("Pod", "pod-delete") in kinds


def test_scheduler_names_default_profile():
    assert scheduler_names({}) == ("default-scheduler",)
    assert scheduler_names({"profiles": [{"schedulerName": "a"}, {}]}) == (
        "a", "default-scheduler")


def test_missing_binaries_error_says_how_to_build(tmp_path, monkeypatch):
    (tmp_path / "etcd").write_text("")
    with pytest.raises(MissingBinariesError) as info:
        find_bin_dir(tmp_path)
    assert "hack/ensure-k8s.sh" in str(info.value)
    assert set(info.value.missing) == set(BINARIES)  # not executable counts as missing
    monkeypatch.setenv("EGPU_K8S_BIN_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(MissingBinariesError, match="EGPU_K8S_BIN_DIR"):
        find_bin_dir()


def test_binaries_are_looked_up_in_the_versioned_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("EGPU_K8S_BIN_DIR", raising=False)
    monkeypatch.setenv("EGPU_K8S_CACHE", str(tmp_path))
    with pytest.raises(MissingBinariesError) as info:
        find_bin_dir()
    # The key names the pinned versions, so a bump never reuses stale binaries.
    assert str(tmp_path / "k8s-v1.36.3_etcd-v3.6.16_kwok-v0.8.0_") in info.value.where
    assert info.value.missing == list(BINARIES)


def test_published_cards_count_a_board_of_chips_as_one_card_unless_split():
    from elastic_gpu.devcluster.nodes import fake_inventory, published_cards

    boards = fake_inventory("ix-0", gpus=4, chips_per_board=2)
    plain = fake_inventory("a-0", gpus=4)
    # What the sandbox waits for the extender to know: the GPUDevices the agent publishes.
    assert published_cards(plain) == 4
    assert published_cards(boards, {"splitBoard": True}) == len(boards.cards)
    assert published_cards(boards) == len(boards.cards) // 2
