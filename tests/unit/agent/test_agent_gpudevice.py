"""GPUDevice objects <-> core cards, and the CRD file kept equal to the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastic_gpu.api.gpudevice import (
    MAX_LISTED_CONTAINERS,
    GPUDeviceError,
    card_from_object,
    card_to_object,
    crd_manifest,
    nodes_from_objects,
    nodes_from_readable_objects,
    usage_status,
)
from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.core.usage import CardUsage, ContainerUsage

ROOT = Path(__file__).resolve().parents[3]


def test_card_round_trips_through_the_object() -> None:
    card = Card(3, "GPU-3", "H100", 81920, health=Health.UNHEALTHY,
                links=(Link(2, LinkKind.NVLINK, 18),),
                mig=(MigInstance(MigProfile(3, 40), "MIG-1", 4, Health.UNHEALTHY),),
                numa_node=1, board="b0")
    obj = card_to_object("node-a", card, "XID 79")
    assert obj["metadata"] == {"name": "node-a-gpu3", "labels": {"elasticgpu.io/node": "node-a"}}
    assert obj["status"]["reason"] == "XID 79" and obj["status"]["health"] == "Unhealthy"
    assert card_from_object(obj) == ("node-a", card)


def test_nodes_group_cards_and_take_capacity_from_node_objects() -> None:
    objs = [card_to_object("b", Card(1, "u1", "T4", 16384)),
            card_to_object("b", Card(0, "u0", "T4", 16384)),
            card_to_object("a", Card(0, "v0", "A10", 24576))]
    k8s = [{"metadata": {"name": "b", "labels": {"zone": "z"}},
            "status": {"allocatable": {"cpu": "32", "memory": "64Gi"}}}]
    a, b = nodes_from_objects(objs, k8s)
    assert (a.name, a.cpu_milli, [c.uuid for c in a.cards]) == ("a", 0, ["v0"])
    assert (b.cpu_milli, b.memory_mib, b.labels) == (32000, 65536, {"zone": "z"})
    assert [c.index for c in b.cards] == [0, 1]


def test_a_controller_view_skips_an_unreadable_gpudevice_and_reports_it() -> None:
    bad = card_to_object("a", Card(1, "u1", "T4", 16384))
    bad["status"] = {"health": "Sick"}
    objs = [card_to_object("a", Card(0, "u0", "T4", 16384)), bad]
    skipped: list[GPUDeviceError] = []
    (node,) = nodes_from_readable_objects(objs, [], skipped.append)
    assert [c.uuid for c in node.cards] == ["u0"]
    assert len(skipped) == 1 and "status.health" in str(skipped[0])


@pytest.mark.parametrize(("patch", "words"), [
    ({"spec": None}, "no spec"),
    ({"spec": {"node": "n", "index": "0", "uuid": "u", "model": "m", "memoryMiB": 1}}, "index"),
    ({"status": {"health": "Sick"}}, "status.health"),
])
def test_malformed_objects_name_the_field(patch: dict[str, object], words: str) -> None:
    obj = card_to_object("n", Card(0, "u", "m", 1))
    obj.update(patch)
    with pytest.raises(GPUDeviceError, match=words):
        card_from_object(obj)


def test_crd_file_matches_the_code() -> None:
    on_disk = yaml.safe_load((ROOT / "deploy/crds/gpudevices.yaml").read_text())
    assert on_disk == crd_manifest()
    columns = [c["name"] for c in on_disk["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:6] == ["Node", "Index", "Model", "Memory", "Health", "Allocated%"]
    assert {"MemoryUsed", "Pods"} <= set(columns)
    status = on_disk["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    # a structural schema prunes unknown fields: everything the agent writes must be in it
    written = card_to_object("n", Card(0, "u", "m", 1))["status"]
    assert set(written) <= set(status["properties"])
    assert on_disk["spec"]["scope"] == "Cluster" and on_disk["spec"]["names"]["shortNames"] == ["gpud"]


def test_observed_usage_round_trips_through_the_status() -> None:
    usage = CardUsage(used_mib=30720, out_of_band_mib=10240, sm_percent=87,
                      observed_at="2026-11-28T20:00:00Z",
                      containers=(ContainerUsage("ns", "p", "c", 20480, 40),
                                  ContainerUsage("ns", "q", "c", 0)))
    card = Card(0, "GPU-0", "A100", 81920, usage=usage)
    obj = card_to_object("node-a", card)
    assert obj["status"]["usage"]["outOfBandMemoryMiB"] == 10240
    assert "smUtilizationPercent" not in obj["status"]["usage"]["containers"][1]
    assert card_from_object(obj) == ("node-a", card)
    assert card_from_object(card_to_object("node-a", Card(0, "GPU-0", "A100", 81920)))[1].usage \
        is None


def test_usage_lists_the_largest_holders_first_and_at_most_a_few() -> None:
    many = tuple(ContainerUsage("ns", f"p{i}", "c", i) for i in range(MAX_LISTED_CONTAINERS + 5))
    status = usage_status(CardUsage(used_mib=1000, out_of_band_mib=0, sm_percent=0,
                                    containers=many))
    listed = [c["pod"] for c in status["containers"]]
    assert len(listed) == MAX_LISTED_CONTAINERS
    assert listed[0] == f"p{MAX_LISTED_CONTAINERS + 4}"


@pytest.mark.parametrize(("usage", "words"), [
    ({"usedMemoryMiB": 10, "outOfBandMemoryMiB": 20, "smUtilizationPercent": 0},
     "exceeds the used memory"),
    ({"usedMemoryMiB": 10, "outOfBandMemoryMiB": 0, "smUtilizationPercent": 101}, "0..100"),
    ({"usedMemoryMiB": "10", "outOfBandMemoryMiB": 0, "smUtilizationPercent": 1},
     "usedMemoryMiB"),
    ({"usedMemoryMiB": 10, "outOfBandMemoryMiB": 0, "smUtilizationPercent": 1,
      "containers": [{"namespace": "n", "pod": "p", "container": "c", "usedMemoryMiB": -1}]},
     "containers[0]"),
])
def test_malformed_usage_names_the_field(usage: dict[str, object], words: str) -> None:
    obj = card_to_object("node-a", Card(0, "GPU-0", "A100", 81920))
    obj["status"]["usage"] = usage
    with pytest.raises(GPUDeviceError, match=r"status\.usage") as err:
        card_from_object(obj)
    assert words in str(err.value)
