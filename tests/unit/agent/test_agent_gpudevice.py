"""GPUDevice objects <-> core cards, and the CRD file kept equal to the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastic_gpu.api.gpudevice import (
    GPUDeviceError,
    card_from_object,
    card_to_object,
    crd_manifest,
    nodes_from_objects,
)
from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance
from elastic_gpu.core.resources import MigProfile

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
