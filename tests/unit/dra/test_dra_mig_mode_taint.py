"""A DRA card in MIG mode with no instance (issue 42): published as its card device with the
NoSchedule taint `gpu.elasticgpu.io/mig-mode` (value the mode), never as a card a claim may
take whole; read back as the card's `mig_mode` (not its health), so the engine places nothing
on it and the dynamic-MIG planner counts it carved, as a GPUDevice's `spec.migMode` is."""

from __future__ import annotations

import pytest

from elastic_gpu.core.dra.devices import (
    FENCE_TAINT,
    MIG_MODE_TAINT,
    health_of_taints,
    mig_mode_of_taints,
    node_slices,
)
from elastic_gpu.core.dra.inventory import cards_from_slices
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.mig.cardstate import card_state
from elastic_gpu.core.model import Card, Health, MigMode

A100 = "A100-SXM4-80GB"


@pytest.mark.parametrize(("mode", "value"), [
    (MigMode(True, True), "on"), (MigMode(True, False), "on-pending-off"),
    (MigMode(False, True), "off-pending-on")])
def test_a_card_in_mig_mode_with_no_instance_is_tainted_with_its_mode(mode: MigMode,
                                                                      value: str) -> None:
    card = Card(0, "GPU-0", A100, 81920, mig_mode=mode)
    (only,) = node_slices("n1", [card], 1)
    (device,) = only["spec"]["devices"]
    assert device["taints"] == [{"key": MIG_MODE_TAINT, "value": value, "effect": "NoSchedule"}]
    assert mig_mode_of_taints(device["taints"]) == mode
    assert health_of_taints(device["taints"]) is Health.HEALTHY  # a mode, not a sickness
    (back,) = node_cards([only])["n1"]
    assert back.mig_mode == mode and back.health is Health.HEALTHY


def test_a_card_out_of_mig_mode_or_without_one_is_untainted() -> None:
    for mode in (None, MigMode(False, False)):
        (only,) = node_slices("n1", [Card(0, "GPU-0", A100, 81920, mig_mode=mode)], 1)
        (device,) = only["spec"]["devices"]
        assert "taints" not in device
        (back,) = node_cards([only])["n1"]
        assert back.mig_mode is None and not back.mig_enabled


def test_fenced_and_in_mig_mode_reads_back_fenced_with_its_mode() -> None:
    card = Card(0, "GPU-0", A100, 81920, health=Health.FENCED, mig_mode=MigMode(True, False))
    (only,) = node_slices("n1", [card], 1)
    (device,) = only["spec"]["devices"]
    assert [t["key"] for t in device["taints"]] == [FENCE_TAINT, MIG_MODE_TAINT]
    (back,) = node_cards([only])["n1"]
    assert back.health is Health.FENCED and back.mig_mode == MigMode(True, False)


def test_the_allocator_and_the_planner_read_it_in_mig_mode() -> None:
    """Our allocator's inventory: in MIG mode now, no whole card or share is placed on it
    (`Card.mig_enabled`); the planner's card state: carved (merged back, or carved further)."""
    slices = node_slices("n1", [Card(0, "GPU-0", A100, 81920, mig_mode=MigMode(True, True)),
                                Card(1, "GPU-1", A100, 81920)], 1)
    left_on, plain = cards_from_slices(slices)["n1"]
    assert left_on.mig_enabled and not plain.mig_enabled
    assert card_state("n1", node_cards(slices)["n1"][0], set()).carved



def test_a_card_whose_mode_on_waits_for_a_reset_is_left_to_no_allocator() -> None:
    """Whole now, MIG after its reset: kube-scheduler sees the taint, and our allocator leaves
    the card out; the views and the controller still see it, with its mode."""
    waiting = Card(0, "GPU-0", A100, 81920, mig_mode=MigMode(False, True))
    slices = node_slices("n1", [waiting, Card(1, "GPU-1", A100, 81920)], 1)
    assert [c.uuid for c in cards_from_slices(slices)["n1"]] == ["GPU-1"]
    (seen, _) = node_cards(slices)["n1"]
    assert seen.mig_mode == MigMode(False, True)


def test_a_taint_value_not_known_reads_as_mig_mode_on() -> None:
    assert mig_mode_of_taints([{"key": MIG_MODE_TAINT, "value": "later"}]) == MigMode(True, True)
    assert mig_mode_of_taints([{"key": "other"}]) is None
