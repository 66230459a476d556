"""The fake backend: YAML inventories, boards, health injected by editing the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_gpu.agent.backends.base import BackendError
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.core.model import Health


def test_health_edits_in_the_file_become_events(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("cards:\n- {model: T4, memoryMiB: 16384}\n- {model: T4, memoryMiB: 16384}\n")
    backend = FakeBackend.from_file(path, "n1")
    assert backend.wait_health(0.01) == []
    path.write_text(path.read_text() + "health:\n- {index: 1, reason: XID 79}\n")
    (event,) = backend.wait_health(2)
    assert (event.uuid, event.health, event.reason) == ("GPU-fake-n1-1", Health.UNHEALTHY, "XID 79")
    assert [c.health for c in backend.discover()] == [Health.HEALTHY, Health.UNHEALTHY]
    path.write_text("cards:\n- {model: T4, memoryMiB: 16384}\n- {model: T4, memoryMiB: 16384}\n")
    (event,) = backend.wait_health(2)
    assert (event.uuid, event.health) == ("GPU-fake-n1-1", Health.HEALTHY)


def test_boards_number_chips_after_cards() -> None:
    backend = FakeBackend.from_dict({"cards": [{"model": "T4", "memoryMiB": 16384}],
                                     "boards": [{"id": "b", "model": "MR-V100", "chips": 2,
                                                 "memoryMiB": 16384}]})
    cards = backend.discover()
    assert [(c.index, c.uuid, c.board) for c in cards] == [
        (0, "GPU-fake-node-0", None), (1, "b-chip0", "b"), (2, "b-chip1", "b")]


@pytest.mark.parametrize(("data", "words"), [
    ({"cards": [{"model": "T4"}]}, "cards.0.memoryMiB"),
    ({"cards": [{"model": "T4", "memoryMiB": 1, "mig": [{"profile": "big", "uuid": "m"}]}]},
     "MIG profile"),
    ({"cards": [{"model": "T4", "memoryMiB": 1, "links": [{"peer": 4, "kind": "nvlink"}]}]},
     "links to card 4"),
    ({"health": [{"index": 0, "uuid": "x"}]}, "exactly one of index or uuid"),
])
def test_bad_inventory_is_a_clear_error(data: object, words: str) -> None:
    with pytest.raises(BackendError, match=words):
        FakeBackend.from_dict(data)


def test_sandbox_inventories_become_a_fake_backend_with_the_same_cards() -> None:
    from elastic_gpu.devcluster.nodes import fake_inventory

    inventory = fake_inventory("gpu-node-000", gpus=4, gpu_model="T4", gpu_memory_mib=16384)
    backend = FakeBackend.from_cards(inventory.cards, inventory.name)
    assert backend.discover() == inventory.cards


BOARD_INVENTORY = {"cards": [{"model": "T4", "memoryMiB": 16384}],
                   "boards": [{"id": "bi0", "model": "BI-V150", "chips": 2, "memoryMiB": 32768},
                              {"id": "bi1", "model": "BI-V150", "chips": 2, "memoryMiB": 32768}]}


def test_board_chips_given_as_cards_stay_boards() -> None:
    """The sandbox hands a node's cards to the backend; chips of multi-chip boards keep their
    board, so the agent's splitBoard decides 1 device per board or 1 per chip."""
    from elastic_gpu.agent.config import AgentConfig
    from elastic_gpu.agent.devices import build_plans, logical_cards, node_capacity

    cards = FakeBackend.from_dict(BOARD_INVENTORY, "n").discover()
    backend = FakeBackend.from_cards(cards, "n")
    assert backend.discover() == cards
    assert [c.board for c in backend.discover()] == [None, "bi0", "bi0", "bi1", "bi1"]
    for split, devices in ((False, "3"), (True, "5")):
        config = AgentConfig(splitBoard=split)
        logical = logical_cards(backend.discover(), split)
        assert node_capacity(logical, config, build_plans(logical, config))[0][
            "nvidia.com/gpu"] == devices
    # an unhealthy chip stays unhealthy (and so does its unsplit board)
    from dataclasses import replace

    sick = (*cards[:3], replace(cards[3], health=Health.UNHEALTHY), cards[4])
    assert [c.health for c in FakeBackend.from_cards(sick, "n").discover()] == [
        Health.HEALTHY, Health.HEALTHY, Health.HEALTHY, Health.UNHEALTHY, Health.HEALTHY]


def test_cards_that_no_boards_section_describes_are_refused() -> None:
    from dataclasses import replace

    cards = FakeBackend.from_dict(BOARD_INVENTORY, "n").discover()
    # a board chip before a plain card
    moved = tuple(replace(c, index=i) for i, c in enumerate((cards[1], cards[0], *cards[2:])))
    with pytest.raises(BackendError, match="after the plain cards"):
        FakeBackend.from_cards(moved, "n")
    # chips of one board apart
    apart = tuple(replace(c, index=i) for i, c in
                  enumerate((cards[0], cards[1], cards[3], cards[2], cards[4])))
    with pytest.raises(BackendError, match="not consecutive"):
        FakeBackend.from_cards(apart, "n")
    # a chip whose name or memory differs from its board's layout
    with pytest.raises(BackendError, match="fake card 2 \\(board bi0\\)"):
        FakeBackend.from_cards((*cards[:2], replace(cards[2], uuid="other"), *cards[3:]), "n")
    with pytest.raises(BackendError, match="fake card 2 \\(board bi0\\)"):
        FakeBackend.from_cards((*cards[:2], replace(cards[2], memory_mib=1), *cards[3:]), "n")
