"""`egpu simulate` end to end, its --placements output checked by an independent checker
(`sim_helpers.check_placements`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_helpers import check_placements, write_nodes, write_pods
from typer.testing import CliRunner

from elastic_gpu.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("policy", ["random", "packing", "fgd", "fgdx"])
def test_placements_respect_the_trace_capacities(tmp_path: Path, policy: str) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = write_pods(tmp_path / "pods.csv", count=120, seed=5)
    out = tmp_path / "placements.csv"
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", policy,
                                 "--seed", "4", "--placements", str(out), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines()[0] == "task,node,cards"
    checked = check_placements(nodes, pods, out)
    summary = json.loads((tmp_path / "r.json").read_text())
    assert checked == summary["placed"]
    assert set(summary["allocation"]) >= {"50", "90", "100", "130"}
    for point, value in summary["allocation"].items():
        assert summary["unallocated"][point] == pytest.approx(int(point) - value, abs=0.011)


def test_the_checker_catches_an_overcommitted_card(tmp_path: Path) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,600\nb,1,1,1,600\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("task,node,cards\na,t4-0,0:600\nb,t4-0,0:600\n")
    with pytest.raises(AssertionError):
        check_placements(nodes, pods, bad)


def test_json_and_plot_outputs(tmp_path: Path) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = write_pods(tmp_path / "pods.csv")
    plot = tmp_path / "r.png"
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods),
                                 "--policy", "bestfit",
                                 "--plot", str(plot), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["policy"] == "bestfit" and summary["card_policy"] == "binpack"
    assert summary["gpu_capacity"] == 21


def test_compare_prints_a_table_beside_the_reference(tmp_path: Path) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = write_pods(tmp_path / "pods.csv")
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "analysis_allo_discrete.csv").write_text(
        "workload,sc_policy,tune,seed,total_gpus,100\npods,06-FGD,1.3,42,21,90.0\n")
    result = runner.invoke(app, ["simulate", "--compare", "--nodes", str(nodes), "--pods", str(pods),
                                 "--policies", "fgd,packing", "--seeds", "1-2", "--processes", "1",
                                 "--reference-dir", str(ref), "--json", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output
    assert "fgd" in result.output and "10.00" in result.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert {m["policy"] for m in data["medians"]} == {"fgd", "packing"}
    assert len(data["runs"]) == 4


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "nope"], "unknown --policy"),
    (["--card-policy", "nope"], "unknown --card-policy"),
    (["--popularity", "0"], "--popularity must be in (0, 1]"),
    (["--popularity", "1.5"], "--popularity must be in (0, 1]"),
])
def test_bad_options_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    nodes = write_nodes(tmp_path / "nodes.csv")
    pods = write_pods(tmp_path / "pods.csv")
    result = runner.invoke(app, ["simulate", "--nodes", str(nodes), "--pods", str(pods), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_nodes_without_pods_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--nodes", str(write_nodes(tmp_path / "n.csv"))])
    assert result.exit_code != 0
