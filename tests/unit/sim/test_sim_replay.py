from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sim_helpers import write_nodes, write_pods

from elastic_gpu.core.frag import Fragmentation, sorted_free
from elastic_gpu.core.workload import TargetWorkload
from elastic_gpu.sim.builtin import builtin_nodes, builtin_tasks
from elastic_gpu.sim.compare import Job, load_reference, medians, parse_seeds, run_jobs
from elastic_gpu.sim.replay import ReplayResult, arrival_order, replay, target_workload
from elastic_gpu.sim.trace import Task, load_nodes, load_tasks, make_node


def tasks_of(gpus: list[int]) -> list[Task]:
    return [Task(f"t{i:02d}", 1000, 1024, 1 if g else 0, g) for i, g in enumerate(gpus)]


def test_resampling_reaches_the_target_and_names_copies() -> None:
    tasks = tasks_of([1000, 500, 0, 250] * 5)
    order = arrival_order(tasks, gpu_capacity_milli=10_000, inflation=1.3, seed=7)
    total = sum(t.total_milli for t in order)
    assert 13_000 - 1000 < total <= 13_000
    originals = [t for t in order if "#" not in t.name]
    copies = [t for t in order if "#" in t.name]
    assert sorted(t.name for t in originals) == sorted(t.name for t in tasks)
    assert [t.name.split("#")[1] for t in copies] == [str(k) for k in range(len(copies))]
    assert order == arrival_order(tasks, 10_000, 1.3, 7)
    assert order != arrival_order(tasks, 10_000, 1.3, 8)


def test_resampling_down_drops_tasks_until_under_the_target() -> None:
    order = arrival_order(tasks_of([1000] * 30), gpu_capacity_milli=10_000, inflation=1.3, seed=1)
    assert sum(t.total_milli for t in order) == 13_000


def test_a_workload_without_gpu_requests_is_not_resampled() -> None:
    tasks = tasks_of([0, 0, 0])
    assert sorted(t.name for t in arrival_order(tasks, 10_000, 1.3, 1)) == ["t00", "t01", "t02"]


def test_curves_bin_arrivals_by_rounded_percent() -> None:
    result = ReplayResult("p", "c", 1, 1.3, 10, 0.0, 4,
                          arrived_milli=np.array([100.0, 1000.0, 1040.0, 3000.0]),
                          used_milli=np.array([100.0, 900.0, 1000.0, 1000.0]),
                          frag_milli=np.zeros(4), idle_milli=np.full(4, 9000.0))
    curve = result.allocation_curve()
    assert curve[1] == 1.0
    assert curve[10] == pytest.approx((9.0 + 10.0) / 2)
    assert curve[11] == pytest.approx((9.0 + 10.0) / 2)  # no exact 11: the 10-12 window
    assert curve[20] == 10.0  # gap: the state after the last arrival below 20%
    assert curve[30] == 10.0


@pytest.mark.parametrize("policy", ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "fgdx",
                                    "fgdx-mem", "fgdx-cpufit"])
def test_small_replays_allocate_what_they_report(tmp_path: Path, policy: str) -> None:
    nodes = load_nodes(write_nodes(tmp_path / "n.csv"))
    tasks = load_tasks(write_pods(tmp_path / "p.csv"))
    result = replay(nodes, tasks, policy, seed=3, keep_placements=True)
    placed = sum(m for p in result.placements for _, m in p.cards)
    assert placed == result.used_milli[-1]
    assert result.used_milli[-1] <= result.gpu_capacity * 1000
    assert len(result.placements) + sum(result.failed.values()) == result.tasks
    summary = result.summary()
    for key in ("policy", "seed", "wall_seconds", "gpu_capacity", "allocation", "unallocated",
                "fragmentation_rate", "failed"):
        assert key in summary


@pytest.mark.parametrize(("policy", "cards"), [("fgd", "fgd"), ("fgdx", "fgd-waste"),
                                              ("fgdx-mem", "fgd-waste"),
                                              ("fgdx-cpufit", "fgd"), ("random", "random"),
                                              ("bestfit", "binpack")])
def test_auto_pairs_each_policy_with_its_documented_card_tier(tmp_path: Path, policy: str,
                                                             cards: str) -> None:
    nodes = load_nodes(write_nodes(tmp_path / "n.csv"))
    tasks = load_tasks(write_pods(tmp_path / "p.csv"))
    assert replay(nodes, tasks, policy, seed=3).card_policy == cards


def test_builtin_cluster_and_workload_have_the_documented_mix() -> None:
    nodes = builtin_nodes()
    assert 1150 < len(nodes) < 1300
    assert 6000 < sum(n.gpu_count for n in nodes) < 6400
    tasks = builtin_tasks()
    share = sum(1 for t in tasks if t.num_gpu == 1 and t.gpu_milli < 1000) / len(tasks)
    cpu = sum(1 for t in tasks if t.num_gpu == 0) / len(tasks)
    multi = sum(1 for t in tasks if t.num_gpu > 1) / len(tasks)
    assert 0.34 < share < 0.42 and 0.10 < cpu < 0.17 and 0.003 < multi < 0.02
    assert builtin_tasks() == tasks  # fixed seed


def test_compare_runs_jobs_and_takes_medians(tmp_path: Path) -> None:
    nodes = str(write_nodes(tmp_path / "n.csv"))
    pods = str(write_pods(tmp_path / "p.csv"))
    jobs = [Job("p", nodes, pods, pol, s, 1.3, "auto") for pol in ("fgd", "bestfit") for s in (1, 2, 3)]
    outcomes = run_jobs(jobs, processes=1)
    table = medians(outcomes)
    assert set(table) == {("p", "fgd"), ("p", "bestfit")}
    assert all(count == 3 for _, count in table.values())
    assert parse_seeds("42-44,50") == [42, 43, 44, 50]
    with pytest.raises(ValueError):
        parse_seeds("5-1")


def test_reference_medians_are_read(tmp_path: Path) -> None:
    (tmp_path / "analysis_allo_discrete.csv").write_text(
        "workload,sc_policy,tune,seed,total_gpus,100\n"
        "w,06-FGD,1.3,42,10,95.0\nw,06-FGD,1.3,43,10,96.0\nw,06-FGD,1.3,44,10,90.0\n")
    assert load_reference(tmp_path) == {("w", "fgd"): 5.0}


def rare_whole_card_trace() -> tuple[list[Task], list[Task]]:
    """97 half-card shares and 3 four-card tasks: FGD's 95% typical pods leave the latter out."""
    shares = [Task(f"s{i:03d}", 2000, 8192, 1, 500) for i in range(97)]
    wholes = [Task(f"w{i}", 8000, 65536, 4, 1000) for i in range(3)]
    return shares, wholes


def test_each_policy_scores_against_its_own_typical_pods() -> None:
    shares, wholes = rare_whole_card_trace()
    tasks = shares + wholes
    share, whole = shares[0].shape(), wholes[0].shape()
    assert target_workload(tasks, "fgd").shapes == (share,)
    assert target_workload(tasks, "fgdx").shapes == (share,)
    assert set(target_workload(tasks, "fgdx-mem").shapes) == {share, whole}
    assert target_workload(tasks, "fgdx-mem", popularity=0.95).shapes == (share,)
    with pytest.raises(ValueError, match="unknown node policy"):
        target_workload(tasks, "nope")


def test_the_reported_fragmentation_is_fgds_whatever_the_policy_scores() -> None:
    """fgdx-mem scores against every shape; the fragmentation a replay reports is still FGD's
    own (95% typical pods), recomputed here from the placements."""
    shares, wholes = rare_whole_card_trace()
    tasks = shares + wholes
    # three-card nodes never fit the four-card shape: their free compute is a fragment for it
    nodes = [make_node(f"n{i}", 32_000, 262_144, 3 + i % 2, "V100M32") for i in range(8)]
    result = replay(nodes, tasks, "fgdx-mem", seed=5, inflation=0.7, keep_placements=True)
    by_name = {t.name: t for t in tasks}
    free = {n.name: [1000] * n.gpu_count for n in nodes}
    cpu = {n.name: n.cpu_milli for n in nodes}
    for placement in result.placements:
        cpu[placement.node] -= by_name[placement.task.split("#")[0]].cpu_milli
        for index, milli in placement.cards:
            free[placement.node][index] -= milli

    def final(workload: TargetWorkload) -> float:
        frag = Fragmentation(workload)
        return sum(frag.node("V100M32", cpu[n], sorted_free(free[n])) for n in free)

    fgds = TargetWorkload.from_tasks(t.shape() for t in tasks)
    assert result.frag_milli[-1] == pytest.approx(final(fgds))
    assert final(target_workload(tasks, "fgdx-mem")) != pytest.approx(final(fgds))
