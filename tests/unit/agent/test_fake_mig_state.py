"""The fake backend's MIG state file (`fake.migState`, issue 42): off unless configured; with
it, a restarted fake reads the layout its card was left with; a file it cannot trust (torn,
another card, a layout the model refuses) is never half-applied."""

from __future__ import annotations

import json
from pathlib import Path

from elastic_gpu.agent.backends.fake import FakeBackend, parse_inventory
from elastic_gpu.core.mig.apply import Create, Destroy, Placed
from elastic_gpu.core.resources import MigProfile

A100 = "A100-SXM4-80GB"
INVENTORY = {"cards": [{"uuid": "GPU-a", "model": A100, "memoryMiB": 81920},
                       {"uuid": "GPU-b", "model": A100, "memoryMiB": 81920,
                        "mig": [{"profile": "7g.80gb", "uuid": "MIG-b", "start": 0}]}]}
P3 = MigProfile.parse("3g.40gb")


def layout(backend: FakeBackend, index: int) -> list[str]:
    return [f"{m.profile.name}@{m.start}" for m in backend.discover()[index].mig]


def test_without_a_state_file_a_restart_starts_from_the_inventory(tmp_path: Path) -> None:
    backend = FakeBackend.from_dict(INVENTORY)
    backend.apply_mig_step("GPU-a", Create(Placed(4, P3)))
    assert layout(backend, 0) == ["3g.40gb@4"]
    assert layout(FakeBackend.from_dict(INVENTORY), 0) == []
    assert list(tmp_path.iterdir()) == []


def test_a_restarted_fake_reads_the_layout_each_step_left(tmp_path: Path) -> None:
    state = tmp_path / "agent" / "fake-mig.json"
    inventory = parse_inventory(INVENTORY, "test")
    backend = FakeBackend(inventory, "n1", mig_state=state)
    assert not state.exists()  # nothing written until a step
    backend.apply_mig_step("GPU-a", Create(Placed(4, P3)))
    again = FakeBackend(inventory, "n1", mig_state=state)
    assert layout(again, 0) == ["3g.40gb@4"] and layout(again, 1) == ["7g.80gb@0"]
    (made,) = again.discover()[0].mig
    assert made.uuid == "MIG-GPU-a-3g.40gb-4"
    again.apply_mig_step("GPU-b", Destroy(again.discover()[1].mig[0]))
    third = FakeBackend(inventory, "n1", mig_state=state)
    assert layout(third, 0) == ["3g.40gb@4"] and layout(third, 1) == []
    assert json.loads(state.read_text())["cards"]["GPU-b"] == []
    assert [p.name for p in state.parent.iterdir()] == ["fake-mig.json"]  # no temporary left


def test_a_state_it_cannot_trust_keeps_the_inventory_layout(tmp_path: Path) -> None:
    inventory = parse_inventory(INVENTORY, "test")
    state = tmp_path / "fake-mig.json"
    state.write_text('{"version": 1, "cards": {"GPU-a"')  # torn
    assert layout(FakeBackend(inventory, "n1", mig_state=state), 0) == []
    assert not state.exists() and (tmp_path / "fake-mig.json.unreadable").exists()
    state.write_text(json.dumps({"version": 1, "cards": {
        "GPU-a": [{"profile": "3g.40gb", "uuid": "MIG-x", "start": 1}],  # no 3g at start 1
        "GPU-b": [{"profile": "1g.10gb", "uuid": "MIG-y", "start": 6}],
        "GPU-gone": []}}))
    backend = FakeBackend(inventory, "n1", mig_state=state)
    assert layout(backend, 0) == [] and layout(backend, 1) == ["1g.10gb@6"]
