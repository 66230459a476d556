"""`egpu simulate` end to end, and an independent checker of its --placements output."""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from sim_helpers import write_nodes, write_pods
from typer.testing import CliRunner

from elastic_gpu.cli.main import app

runner = CliRunner()


def check_placements(nodes_csv: Path, pods_csv: Path, placements_csv: Path) -> int:
    """Re-read the trace and the placements with nothing from the simulator, and verify every
    capacity and model constraint. Returns the number of placements checked."""
    nodes = {r["sn"]: r for r in csv.DictReader(nodes_csv.open())}
    tasks = {r["name"]: r for r in csv.DictReader(pods_csv.open())}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    card_milli: dict[tuple[str, int], int] = defaultdict(int)
    whole_cards: set[tuple[str, int]] = set()
    rows = list(csv.DictReader(placements_csv.open()))
    assert rows, "no placements"
    for row in rows:
        task = tasks[row["task"].split("#")[0]]
        node = nodes[row["node"]]
        assert int(node["gpu"]) > 0
        cpu[row["node"]] += int(task["cpu_milli"])
        mem[row["node"]] += int(task["memory_mib"])
        cards = [c for c in row["cards"].split(";") if c]
        assert len(cards) == int(task["num_gpu"])
        spec = (task.get("gpu_spec") or "").split("|")
        if cards and any(spec):
            assert node["model"] in spec
        for item in cards:
            index, milli = (int(x) for x in item.split(":"))
            assert 0 <= index < int(node["gpu"])
            assert milli == int(task["gpu_milli"])
            key = (row["node"], index)
            assert key not in whole_cards, "a whole card was shared"
            card_milli[key] += milli
            if milli == 1000:
                whole_cards.add(key)
                assert card_milli[key] == 1000, "a whole card was given while partly used"
    for key, used in card_milli.items():
        assert used <= 1000, key
    for name in cpu:
        assert cpu[name] <= int(nodes[name]["cpu_milli"])
        assert mem[name] <= int(nodes[name]["memory_mib"])
    return len(rows)


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
