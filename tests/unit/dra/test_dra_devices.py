"""core.dra: the slices a node publishes and the card shares an allocation result stands for."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.allocation import AllocationError, allocated_devices
from elastic_gpu.core.dra.classes import CARD_CLASS, EXTENDED_RESOURCE, MIG_CLASS, device_classes
from elastic_gpu.core.dra.devices import (
    DRIVER,
    UNHEALTHY_TAINT,
    device_table,
    node_slices,
)
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.resources import MigProfile

A100 = "NVIDIA A100-SXM4-80GB"


def _cards() -> list[Card]:
    mig = (MigInstance(MigProfile.parse("3g.40gb"), "MIG-a", 0),
           MigInstance(MigProfile.parse("1g.10gb"), "MIG-b", 4, Health.UNHEALTHY))
    return [Card(0, "GPU-0", A100, 81920, numa_node=1),
            Card(1, "GPU-1", A100, 81920, mig=mig),
            Card(2, "GPU-2", A100, 81920, health=Health.UNHEALTHY)]


def _result(device: str, pool: str = "n1", **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": pool, "device": device}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def _claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def test_a_node_is_one_pool_with_its_counters_in_a_slice_of_their_own() -> None:
    devices, counters = node_slices("n1", _cards(), 3, {"name": "n1", "uid": "u1"})
    for s in (devices, counters):
        assert s["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 2}
        assert s["spec"]["nodeName"] == "n1" and s["spec"]["driver"] == DRIVER
        assert s["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert "sharedCounters" not in devices["spec"] and "devices" not in counters["spec"]
    names = [d["name"] for d in devices["spec"]["devices"]]
    assert names == ["gpu-0", "gpu-1-mig-0-3g-40gb", "gpu-1-mig-4-1g-10gb", "gpu-2"]
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-1"]


def test_a_card_is_one_shareable_device_whose_defaults_are_the_whole_card() -> None:
    (devices, _) = node_slices("n1", _cards(), 1)
    card = devices["spec"]["devices"][0]
    assert card["allowMultipleAllocations"] is True
    assert card["attributes"]["numaNode"] == {"int": 1}
    compute, memory = card["capacity"]["compute"], card["capacity"]["memory"]
    assert compute["value"] == compute["requestPolicy"]["default"] == "100"
    assert compute["requestPolicy"]["validRange"] == {"min": "1", "max": "100", "step": "1"}
    assert memory["value"] == memory["requestPolicy"]["default"] == "81920Mi"
    assert memory["requestPolicy"]["validRange"]["step"] == "1Mi"
    assert "taints" not in card


def test_mig_instances_consume_their_cards_counters_and_sick_devices_are_tainted() -> None:
    (devices, _) = node_slices("n1", _cards(), 1)
    by_name = {d["name"]: d for d in devices["spec"]["devices"]}
    mig = by_name["gpu-1-mig-0-3g-40gb"]
    assert mig["consumesCounters"] == [{"counterSet": "gpu-1", "counters": {
        "compute-slices": {"value": "3"}, "memory": {"value": "40960Mi"}}}]
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert "allowMultipleAllocations" not in mig
    assert "taints" not in mig
    for sick in ("gpu-1-mig-4-1g-10gb", "gpu-2"):
        assert by_name[sick]["taints"][0]["key"] == UNHEALTHY_TAINT
        assert by_name[sick]["taints"][0]["effect"] == "NoSchedule"


def test_a_card_without_mig_needs_no_counter_slice() -> None:
    (only,) = node_slices("n1", [Card(0, "GPU-0", A100, 81920)], 1)
    assert only["spec"]["pool"]["resourceSliceCount"] == 1


def test_allocation_results_are_the_shares_the_device_plugin_path_hands_out() -> None:
    table = device_table(_cards())
    claim = _claim(_result("gpu-0", compute="25", memory="4Gi"),
                   _result("gpu-2"),
                   _result("gpu-0", compute="100", memory="81920Mi"),
                   _result("gpu-1-mig-0-3g-40gb"),
                   _result("gpu-0", pool="other-node"),
                   {**_result("gpu-0"), "driver": "other.example.com"})
    shares = [d.share for d in allocated_devices(claim, "n1", table)]
    assert shares == [CardShare(0, "GPU-0", 250, 4096),
                      CardShare(2, "GPU-2", 1000, 81920),
                      CardShare(0, "GPU-0", 1000, 81920),
                      CardShare(1, "GPU-1", 0, 40960, "3g.40gb", "MIG-a")]


@pytest.mark.parametrize(("result", "says"), [
    (_result("gpu-7"), "not one this node publishes"),
    (_result("gpu-0", compute="150"), "not a whole percent"),
    (_result("gpu-0", compute="0.5"), "not a whole percent"),
    (_result("gpu-0", memory="100Gi"), "not whole MiB"),
    (_result("gpu-0", memory="1000"), "not whole MiB"),
    (_result("gpu-0", memory="lots"), "consumedCapacity memory"),
])
def test_an_allocation_this_node_cannot_honour_is_refused_with_why(
        result: dict[str, Any], says: str) -> None:
    with pytest.raises(AllocationError, match=says):
        allocated_devices(_claim(result), "n1", device_table(_cards()))


def test_the_classes_select_cards_and_mig_instances_of_this_driver() -> None:
    cards, mig = device_classes()
    assert cards["metadata"]["name"] == CARD_CLASS == DRIVER
    assert cards["spec"]["extendedResourceName"] == EXTENDED_RESOURCE
    assert '.type == "gpu"' in cards["spec"]["selectors"][0]["cel"]["expression"]
    assert mig["metadata"]["name"] == MIG_CLASS
    assert '.type == "mig"' in mig["spec"]["selectors"][0]["cel"]["expression"]
    assert "extendedResourceName" not in mig["spec"]
