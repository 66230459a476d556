"""`egpu simulate --mig-mix`: the MIG mix's spec, its tasks, static layouts against the
planner (every plan valid by NVIDIA's rules, nothing held destroyed), and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from elastic_gpu.cli.main import app
from elastic_gpu.core.mig.cardstate import CardState, Instance
from elastic_gpu.core.mig.layout import Placement
from elastic_gpu.core.mig.pick import free_instances
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.sim.migmix import (
    MigMixSpec,
    MixTask,
    _as_card,
    _place_mig,
    _Pool,
    _profile_of,
    compare_mix,
    mix_tasks,
    run_mix,
)
from elastic_gpu.sim.trace import Task

TRACE = [Task(f"t{k}", 4000, 8192, 1, m) for k, m in
         enumerate([100, 250, 300, 500, 1000, 1000, 700, 150])]


def test_spec_parses_and_refuses_nonsense() -> None:
    assert MigMixSpec.parse("default") == MigMixSpec()
    spec = MigMixSpec.parse("nodes=2, gpus=4, model=H100-80GB, load=0.5, cooldown-s=60")
    assert (spec.nodes, spec.gpus, spec.model, spec.load, spec.cooldown_s) == \
        (2, 4, "H100-80GB", 0.5, 60.0)
    for bad, says in [("nodes", "KEY=VALUE"), ("colour=red", "KEY=VALUE"),
                      ("nodes=two", "not a int"), ("model=Tesla-T4", "no MIG model"),
                      ("profiles=1.5", "profiles in")]:
        with pytest.raises(ValueError, match=says):
            MigMixSpec.parse(bad)


def test_tasks_are_deterministic_and_mix_the_trace_with_profiles() -> None:
    spec = MigMixSpec(nodes=2, gpus=4, tasks=300)
    tasks = mix_tasks(spec, TRACE, 7)
    assert tasks == mix_tasks(spec, TRACE, 7) and tasks != mix_tasks(spec, TRACE, 8)
    assert len(tasks) == 300 and len({t.name for t in tasks}) == 300
    assert any(t.profile is None for t in tasks)                  # the trace's whole cards
    assert any(t.name.startswith("t") and t.profile for t in tasks)   # its shares as MIG
    assert any(t.name.startswith("mig-") for t in tasks)          # the synthetic mix
    assert all(t.leave > t.arrive for t in tasks)
    shares = {t.name.split("#")[0]: t.profile for t in tasks if t.name.startswith("t")}
    # 250 milli = 1.75 slices of 7: a 2g.20gb; 700 milli: 4.9 slices: a 7g.80gb
    assert shares.get("t1") is not None and shares["t1"].name == "2g.20gb"
    assert shares.get("t6") is not None and shares["t6"].name == "7g.80gb"


@pytest.mark.parametrize("model", ["A100-SXM4-80GB", "A100-SXM4-40GB", "A30-24GB",
                                   "H100-80GB", "H200-141GB"])
def test_dynamic_serves_more_mig_and_every_plan_is_valid(model: str) -> None:
    spec = MigMixSpec(nodes=2, gpus=4, model=model, tasks=400, load=0.8)
    static, dynamic = compare_mix(spec, TRACE, 42)
    assert static.planner_calls == 0 and static.changes == 0
    assert dynamic.planner_calls > 0 and dynamic.changes > 0
    assert dynamic.invalid_layouts == 0 and dynamic.held_destroyed == 0
    assert dynamic.mig_served > static.mig_served
    assert static.mig_tasks == dynamic.mig_tasks and static.whole_tasks == dynamic.whole_tasks


def test_carved_cards_are_merged_back_for_whole_cards_after_the_cool_down() -> None:
    spec = MigMixSpec(nodes=1, gpus=4, tasks=400, load=0.9, cooldown_s=0)
    tasks = mix_tasks(spec, TRACE, 3)
    quick = run_mix(spec, tasks, dynamic=True)
    never = run_mix(MigMixSpec(nodes=1, gpus=4, tasks=400, load=0.9, cooldown_s=1e12),
                    tasks, dynamic=True)
    assert quick.merges > 0 and never.merges == 0
    assert quick.whole_served > never.whole_served


def test_cli_prints_and_writes_the_mig_mix(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["simulate", "--mig-mix", "nodes=1,gpus=4,tasks=200",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "MIG demand: 1 x 4 A100-SXM4-80GB" in result.output
    runs = json.loads(out.read_text())["mig_mix"]["runs"]
    assert [r["mode"] for r in runs] == ["static", "dynamic"]
    bad = CliRunner().invoke(app, ["simulate", "--mig-mix", "nodes=0"])
    assert bad.exit_code == 2 and "at least 1" in bad.output


def _card(k: int, held: int, free: int, profile: MigProfile) -> CardState:
    uuid = f"GPU-{k}"
    return CardState(f"node-{k}", uuid, "A100-SXM4-80GB", tuple(
        Instance(Placement(profile, s), f"MIG-{uuid}-{s}", held=s < held)
        for s in range(held + free)))


def test_a_mig_task_takes_the_instance_core_mig_pick_takes() -> None:
    """One instance rule (`core.mig.pick`), not the simulator's own: of two partly held cards
    the fullest (fewest free) one, though the other holds more; a card nothing holds last."""
    model = mig_model("A100-SXM4-80GB")
    assert model is not None
    small = _profile_of(model, 1)
    cards = [_card(0, 0, 1, small), _card(1, 2, 3, small), _card(2, 1, 1, small)]
    pool = _Pool(model, list(cards))
    task = MixTask("t", 0.0, 1.0, small)
    assert _place_mig(pool, task) == "MIG-GPU-2-1"
    assert [i.uuid for i in pool.cards[2].held] == ["MIG-GPU-2-0", "MIG-GPU-2-1"]
    assert _place_mig(pool, task) == "MIG-GPU-1-2"
    held = {"MIG-GPU-1-0", "MIG-GPU-1-1", "MIG-GPU-2-0"}
    first = free_instances([_as_card(model, k, c) for k, c in enumerate(cards)], small, held)
    assert first[0][1].uuid == "MIG-GPU-2-1"
    pool = _Pool(model, [cards[0]])
    assert _place_mig(pool, task) == "MIG-GPU-0-0"
    assert _place_mig(pool, task) is None
