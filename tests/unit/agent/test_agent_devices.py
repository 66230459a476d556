"""Boards, time-slicing, MIG strategies and share devices, as the IX/NVIDIA plugins document."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import (
    InventoryError,
    PluginKind,
    build_plans,
    logical_cards,
    node_capacity,
    preferred,
)
from elastic_gpu.core.model import Health, LinkKind
from elastic_gpu.core.nodefit import NODE_CORE

BOARD = {"boards": [{"id": "bi0", "model": "BI-V150", "chips": 2, "memoryMiB": 32768}]}


def plans_for(inventory: dict[str, Any], **config: Any) -> dict[str, Any]:
    cfg = parse_config(config)
    cards = logical_cards(FakeBackend.from_dict(inventory, "n1").discover(), cfg.splitBoard)
    return {plan.resource: plan for plan in build_plans(cards, cfg)}


def test_two_chip_board_is_one_device_unless_split() -> None:
    whole = plans_for(BOARD, resources={"gpu": "iluvatar.com/gpu"})
    assert len(whole["iluvatar.com/gpu"].devices) == 1
    split = plans_for(BOARD, splitBoard=True, resources={"gpu": "iluvatar.com/gpu"})
    assert len(split["iluvatar.com/gpu"].devices) == 2


def test_unsplit_board_card_holds_both_chips_and_their_memory() -> None:
    cfg = parse_config({})
    (card,) = logical_cards(FakeBackend.from_dict(BOARD).discover(), cfg.splitBoard)
    assert card.card.memory_mib == 2 * 32768
    assert card.uuids == ("bi0-chip0", "bi0-chip1") and card.card.uuid == "bi0"
    chips = logical_cards(FakeBackend.from_dict(BOARD).discover(), True)
    assert [c.card.memory_mib for c in chips] == [32768, 32768]
    assert chips[0].card.links[0].kind is LinkKind.SAME_BOARD and chips[0].card.links[0].peer == 1


def test_board_is_unhealthy_when_one_chip_is() -> None:
    backend = FakeBackend.from_dict({**BOARD, "health": [{"uuid": "bi0-chip1"}]})
    (card,) = logical_cards(backend.discover(), False)
    assert card.card.health is Health.UNHEALTHY


TWO_GPUS = {"cards": [{"model": "A100", "memoryMiB": 40960}, {"model": "A100", "memoryMiB": 40960}]}


def test_two_gpus_with_four_replicas_advertise_eight() -> None:
    plans = plans_for(TWO_GPUS, timeSlicing={"replicas": 4})
    gpu = plans["nvidia.com/gpu"]
    assert len(gpu.devices) == 8 and gpu.kind is PluginKind.REPLICA
    assert {u.card for u in gpu.devices} == {0, 1}
    assert len({u.id for u in gpu.devices}) == 8
    renamed = plans_for(TWO_GPUS, timeSlicing={"replicas": 4, "renameByDefault": True})
    assert "nvidia.com/gpu" not in renamed and len(renamed["nvidia.com/gpu.shared"].devices) == 8


def test_without_replicas_whole_cards_are_one_device_each_named_by_uuid() -> None:
    gpu = plans_for(TWO_GPUS)["nvidia.com/gpu"]
    assert [u.id for u in gpu.devices] == ["GPU-fake-n1-0", "GPU-fake-n1-1"]
    assert gpu.kind is PluginKind.WHOLE and not gpu.kubelet_chooses


MIG = {"cards": [
    {"model": "A100-80GB", "memoryMiB": 81920, "mig": [
        {"profile": "3g.40gb", "uuid": "MIG-a", "start": 0},
        {"profile": "1g.10gb", "uuid": "MIG-b", "start": 4},
        {"profile": "1g.10gb", "uuid": "MIG-c", "start": 5}]},
    {"model": "A100-80GB", "memoryMiB": 81920},
]}


def test_mig_mixed_advertises_each_profile_and_keeps_plain_cards_whole() -> None:
    plans = plans_for(MIG, migStrategy="mixed")
    assert [u.id for u in plans["nvidia.com/mig-3g.40gb"].devices] == ["MIG-a"]
    assert [u.id for u in plans["nvidia.com/mig-1g.10gb"].devices] == ["MIG-b", "MIG-c"]
    assert [u.card for u in plans["nvidia.com/gpu"].devices] == [1]
    # shares are sold only from the card that is not carved up
    assert {u.card for u in plans["elasticgpu.io/gpu-core"].devices} == {1}


def test_mig_single_advertises_instances_as_the_plain_gpu_resource() -> None:
    same = {"cards": [
        {"model": "A100", "memoryMiB": 40960, "mig": [{"profile": "1g.5gb", "uuid": f"MIG-{i}"}
                                                      for i in range(7)]},
        {"model": "A100", "memoryMiB": 40960, "mig": [{"profile": "1g.5gb", "uuid": f"MIG-x{i}"}
                                                      for i in range(7)]}]}
    plans = plans_for(same, migStrategy="single")
    assert len(plans["nvidia.com/gpu"].devices) == 14
    assert not any(name.startswith("nvidia.com/mig-") for name in plans)


def test_mig_single_refuses_a_mix() -> None:
    with pytest.raises(InventoryError, match="single needs MIG enabled on every card"):
        plans_for(MIG, migStrategy="single")


def test_mig_none_ignores_instances() -> None:
    plans = plans_for(MIG)
    assert len(plans["nvidia.com/gpu"].devices) == 2
    assert not any(name.startswith("nvidia.com/mig-") for name in plans)


def test_share_devices_one_per_percent_and_memory_by_granularity() -> None:
    plans = plans_for(TWO_GPUS, resources={"share": ["elasticgpu.io/gpu-core", "tencent.com/vcuda-core"],
                                           "memory": ["elasticgpu.io/gpu-memory",
                                                      "tencent.com/vcuda-memory"]})
    assert len(plans["elasticgpu.io/gpu-core"].devices) == 200
    assert len(plans["tencent.com/vcuda-core"].devices) == 200
    # 40960 MiB / 256 MiB = 160 devices per card: small enough for a device plugin
    assert len(plans["tencent.com/vcuda-memory"].devices) == 320
    # 40960 devices per card would be too many: status only
    assert "elasticgpu.io/gpu-memory" not in plans


def test_node_capacity_counts_devices_and_only_healthy_ones_are_allocatable() -> None:
    cfg = parse_config({})
    backend = FakeBackend.from_dict({**TWO_GPUS, "health": [{"index": 1, "reason": "XID 79"}]})
    cards = logical_cards(backend.discover(), False)
    capacity, allocatable = node_capacity(cards, cfg, build_plans(cards, cfg))
    assert capacity == {"nvidia.com/gpu": "2", "elasticgpu.io/gpu-core": "200",
                        "elasticgpu.io/gpu-memory": "81920", "elasticgpu.io/gpu-tflops": "624",
                        NODE_CORE: "200"}
    # the node-level count kube-scheduler reads stays whole: a pod still holding the unhealthy
    # card must not make the healthy one look full (the extender refuses unhealthy cards)
    assert allocatable == {"nvidia.com/gpu": "1", "elasticgpu.io/gpu-core": "100",
                           "elasticgpu.io/gpu-memory": "40960", "elasticgpu.io/gpu-tflops": "312",
                           NODE_CORE: "200"}


def test_tflops_devices_one_per_tflops_of_each_cards_model() -> None:
    # Two models and a card the TFLOPS table does not know (it advertises none: kubelet
    # then admits no TFLOPS pod on it, as the scheduler places none there).
    inventory = {"cards": [{"model": "A100-SXM4-80GB", "memoryMiB": 81920},
                           {"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81920},
                           {"model": "Tesla P100-PCIE-16GB", "memoryMiB": 16384}]}
    plan = plans_for(inventory)["elasticgpu.io/gpu-tflops"]
    assert plan.kind is PluginKind.TFLOPS
    per_card: dict[int, int] = {}
    for unit in plan.devices:
        per_card[unit.card] = per_card.get(unit.card, 0) + 1
    assert per_card == {0: 312, 1: 989}
    assert len({unit.id for unit in plan.devices}) == 312 + 989
    # A device plugin whatever maxDevicesPerCard says (that bound is the memory resources'):
    # without Allocate no container would get its card.
    assert len(plans_for(inventory, resources={"maxDevicesPerCard": 10})[
        "elasticgpu.io/gpu-tflops"].devices) == 312 + 989
    # Configured off, or a node of no known model: no TFLOPS plugin at all.
    assert "elasticgpu.io/gpu-tflops" not in plans_for(inventory, resources={"tflops": []})
    assert "elasticgpu.io/gpu-tflops" not in plans_for(
        {"cards": [{"model": "Tesla P100-PCIE-16GB", "memoryMiB": 16384}]})


def test_tflops_are_not_sold_from_mig_cards() -> None:
    inventory = {"cards": [
        {"model": "A100-SXM4-80GB", "memoryMiB": 81920,
         "mig": [{"profile": "3g.40gb", "uuid": "MIG-a", "start": 0}]},
        {"model": "A100-SXM4-80GB", "memoryMiB": 81920}]}
    plan = plans_for(inventory, migStrategy="mixed")["elasticgpu.io/gpu-tflops"]
    assert {unit.card for unit in plan.devices} == {1}


def test_preferred_allocation_follows_nvlink() -> None:
    # 0-1 and 2-3 are NVLink pairs; 1-2 only share a PCIe switch.
    def card(peer_nv: int, others: list[int]) -> dict[str, Any]:
        links = [{"peer": peer_nv, "kind": "nvlink", "count": 12}]
        links += [{"peer": p, "kind": "pcie-switch"} for p in others]
        return {"model": "H100", "memoryMiB": 81920, "links": links}
    inv = {"cards": [card(1, [2, 3]), card(0, [2, 3]), card(3, [0, 1]), card(2, [0, 1])]}
    cfg = parse_config({})
    cards = logical_cards(FakeBackend.from_dict(inv).discover(), False)
    plan = {p.resource: p for p in build_plans(cards, cfg)}["nvidia.com/gpu"]
    units = plan.by_id()
    by_index = {lc.index: lc.card for lc in cards}
    ids = [u.id for u in plan.devices]
    # with card 2 required, its NVLink peer 3 comes next, not 0 or 1
    assert preferred(ids, [ids[2]], 2, units, by_index) == [ids[2], ids[3]]
    assert preferred([ids[0], ids[2], ids[3]], [], 2, units, by_index) == [ids[2], ids[3]]
    # shares stay on one card
    core = {p.resource: p for p in build_plans(cards, cfg)}["elasticgpu.io/gpu-core"]
    core_ids = [u.id for u in core.devices]
    chosen = preferred(core_ids, [], 30, core.by_id(), by_index)
    assert len(chosen) == 30 and len({core.by_id()[d].card for d in chosen}) == 1
