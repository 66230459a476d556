"""`egpu simulate` with defragmentation (`--defrag-moves`): K = 0 is the replay as it always
was; K > 0 moves placed tasks to place a task that failed, and the placements still respect
every capacity (checked by the independent checker, `sim_helpers.check_placements`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_helpers import check_placements, write_nodes, write_pods
from typer.testing import CliRunner

from elastic_gpu.cli.main import app
from elastic_gpu.sim import replay as replay_module
from elastic_gpu.sim.replay import arrival_order, replay
from elastic_gpu.sim.trace import Task, make_node

runner = CliRunner()


def test_a_whole_card_task_gets_a_card_once_a_share_moves() -> None:
    # spread puts the two shares on the two one-card nodes; the whole-card task then needs one
    nodes = [make_node("n0", 64_000, 262_144, 1, "V100"), make_node("n1", 64_000, 262_144, 1, "V100")]
    tasks = [Task("s1", 1000, 1024, 1, 400), Task("s2", 1000, 1024, 1, 400),
             Task("w", 1000, 1024, 1, 1000)]
    seed = next(s for s in range(100) if arrival_order(tasks, 2000, 0, s)[-1].name == "w")
    without = replay(nodes, tasks, "spread", seed=seed, inflation=0)
    assert dict(without.failed) == {"gpu": 1}
    assert "defrag" not in without.summary()
    with_moves = replay(nodes, tasks, "spread", seed=seed, inflation=0, defrag_moves=1,
                        keep_placements=True)
    assert not with_moves.failed
    defrag = with_moves.summary()["defrag"]
    assert defrag == {"defrag_moves": 1, "moves": 1, "moves_to_100": 1, "rescued": 1,
                      "rescued_to_100": 1, "moves_pct_of_tasks": round(100 / 3, 3)}
    ended = {p.task: (p.node, p.cards) for p in with_moves.placements}
    assert ended["s1"][0] == ended["s2"][0] != ended["w"][0]  # the shares share a card now
    assert ended["w"][1] == ((0, 1000),)


def test_without_a_budget_the_planner_is_never_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the planner was called with K = 0")

    monkeypatch.setattr(replay_module, "plan_moves", refuse)
    nodes = [make_node("n0", 64_000, 262_144, 1, "V100")]
    tasks = [Task("s1", 1000, 1024, 1, 400), Task("w", 1000, 1024, 1, 1000)]
    result = replay(nodes, tasks, "spread", seed=1, inflation=0)
    assert result.failed and result.moves == 0
    with pytest.raises(ValueError, match="move budget"):
        replay(nodes, tasks, "spread", seed=1, inflation=0, defrag_moves=-1)


@pytest.mark.parametrize("policy", ["fgdx-auto", "spread"])
def test_placements_after_moves_respect_the_trace_capacities(tmp_path: Path, policy: str) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = write_pods(tmp_path / "pods.csv", count=80, seed=3)  # a trace where tasks move
    out = tmp_path / "placements.csv"
    summary = tmp_path / "run.json"
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods),
                                 "--policy", policy, "--defrag-moves", "2",
                                 "--placements", str(out), "--json", str(summary)])
    assert result.exit_code == 0, result.output
    data = json.loads(summary.read_text())
    assert check_placements(nodes, pods, out) == data["placed"]
    assert data["defrag"]["defrag_moves"] == 2 and data["defrag"]["moves"] > 0
    assert "defragmentation (at most 2 moves per failed task)" in result.output


def test_compare_sweeps_move_budgets(tmp_path: Path) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = write_pods(tmp_path / "pods.csv", count=40, seed=3)
    out = tmp_path / "cmp.json"
    result = runner.invoke(app, ["simulate", "--compare", "--nodes", str(nodes), "--pods", str(pods),
                                 "--policies", "spread", "--seeds", "1-2", "--processes", "1",
                                 "--defrag-moves", "0,2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(out.read_text())["medians"]}
    assert set(rows) == {"spread", "spread k=2"}
    assert rows["spread"]["runs"] == rows["spread k=2"]["runs"] == 2
    assert "median_moves_pct" not in rows["spread"] and "median_moves_pct" in rows["spread k=2"]
    assert "moves % of tasks" in result.output


@pytest.mark.parametrize("value", ["-1", "two", "1,,2"])
def test_a_bad_move_budget_is_named(tmp_path: Path, value: str) -> None:
    result = runner.invoke(app, ["simulate", "--defrag-moves", value])
    assert result.exit_code == 2
    assert "--defrag-moves" in result.output


def test_several_budgets_need_compare() -> None:
    result = runner.invoke(app, ["simulate", "--defrag-moves", "0,1"])
    assert result.exit_code == 2
    assert "need --compare" in result.output
