"""The FGD fragmentation measure and the target workload."""

from __future__ import annotations

from collections import Counter

import pytest

from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.workload import TargetWorkload, TaskShape


def test_fragment_is_the_free_compute_a_task_cannot_use() -> None:
    # Half the tasks want 600 milli, half want a whole card.
    frag = Fragmentation(TargetWorkload((TaskShape(1000, 600, 1), TaskShape(1000, 1000, 1)), (0.5, 0.5)))
    # cards free: 1000 and 500. The 600 task fits (fragment: the 500 card), the whole task fits
    # (fragment: the 500 card): 0.5*500 + 0.5*500.
    assert frag.node("T4", 32000, (1000, 500)) == pytest.approx(500)
    # cards free: 500 and 500: no task fits; all 1000 free milli are a fragment.
    assert frag.node("T4", 32000, (500, 500)) == pytest.approx(1000)
    # no CPU left: nothing fits however much GPU is free.
    assert frag.node("T4", 0, (1000, 1000)) == pytest.approx(2000)
    assert frag.node("T4", 32000, ()) == 0


def test_model_constraints_and_cpu_only_tasks_count_all_free_compute() -> None:
    frag = Fragmentation(TargetWorkload((TaskShape(1000, 0, 0), TaskShape(1000, 300, 1, frozenset({"A100"}))),
                                        (0.5, 0.5)))
    assert frag.node("T4", 32000, (1000,)) == pytest.approx(1000)
    assert frag.node("A100", 32000, (1000,)) == pytest.approx(500)


def test_from_tasks_keeps_the_popular_shapes_and_renormalises() -> None:
    tasks = [TaskShape(1000, 500, 1)] * 60 + [TaskShape(2000, 1000, 1)] * 35 + [TaskShape(3000, 1000, 8)] * 5
    workload = TargetWorkload.from_tasks(tasks, popularity=0.9)
    assert workload.shapes == (TaskShape(1000, 500, 1), TaskShape(2000, 1000, 1))
    assert workload.weights == pytest.approx((60 / 95, 35 / 95))
    zero_cpu = TargetWorkload.from_tasks([TaskShape(0, 0, 0)])
    assert zero_cpu.shapes == (TaskShape(100, 0, 0),)


def test_bad_workloads_are_rejected() -> None:
    with pytest.raises(ValueError):
        TargetWorkload((TaskShape(1, 0, 0),), (0.5,))
    with pytest.raises(ValueError):
        TargetWorkload.from_tasks([])


def test_memory_counts_only_in_the_memory_aware_measure() -> None:
    # Half the tasks want a whole card and 40 GiB, half want half a card and 2 GiB.
    frag = Fragmentation(TargetWorkload((TaskShape(1000, 1000, 1, memory_mib=40_960),
                                         TaskShape(1000, 500, 1, memory_mib=2048)), (0.5, 0.5)))
    # FGD's own measure ignores memory: both shapes fit two idle cards.
    assert frag.node("T4", 32000, (1000, 1000)) == pytest.approx(0)
    # With 8 GiB free the whole-card shape cannot run: both cards are a fragment for it.
    assert frag.node_with_memory("T4", 32000, 8192, (1000, 1000)) == pytest.approx(0.5 * 2000)
    # With 64 GiB free both fit again; with 1 GiB neither does.
    assert frag.node_with_memory("T4", 32000, 65536, (1000, 1000)) == pytest.approx(0)
    assert frag.node_with_memory("T4", 32000, 1024, (1000, 1000)) == pytest.approx(2000)
    # CPU still counts in the memory-aware measure.
    assert frag.node_with_memory("T4", 0, 65536, (1000, 1000)) == pytest.approx(2000)


def test_typical_pods_are_counted_without_memory_then_split_over_it() -> None:
    """FGD's typical pods must not change when tasks carry memory (faithfulness); the weight of
    each shape is then split over its tasks' memory requests."""
    tasks = ([TaskShape(1000, 500, 1, memory_mib=m) for m in (1024, 1024, 1024, 2048)] * 15
             + [TaskShape(2000, 1000, 1, memory_mib=4096)] * 35
             + [TaskShape(3000, 1000, 8, memory_mib=m) for m in range(5)])
    workload = TargetWorkload.from_tasks(tasks, popularity=0.9)
    assert workload.shapes == (TaskShape(1000, 500, 1, memory_mib=1024),
                               TaskShape(1000, 500, 1, memory_mib=2048),
                               TaskShape(2000, 1000, 1, memory_mib=4096))
    assert workload.weights == pytest.approx((45 / 95, 15 / 95, 35 / 95))
    blind = TargetWorkload.from_tasks([t.without_memory() for t in tasks], popularity=0.9)
    frag, frag_blind = Fragmentation(workload), Fragmentation(blind)
    for state in ((1000, 500), (400, 400), (1000, 1000, 0)):
        for cpu in (0, 1000, 1500, 4000):
            assert frag.node("T4", cpu, state) == pytest.approx(frag_blind.node("T4", cpu, state))


def test_from_counts_is_from_tasks_over_counted_shapes() -> None:
    tasks = ([TaskShape(0, 300, 1, memory_mib=512)] * 7 + [TaskShape(4000, 1000, 2, memory_mib=9)] * 3
             + [TaskShape(1000, 0, 0, memory_mib=m) for m in (1, 2, 2)])
    counts = Counter(tasks)
    counts[TaskShape(9, 9, 1)] = 0  # a shape whose pods all left
    assert TargetWorkload.from_counts(counts, popularity=0.8) == TargetWorkload.from_tasks(
        tasks, popularity=0.8)
    with pytest.raises(ValueError, match="no tasks"):
        TargetWorkload.from_counts({TaskShape(1, 0, 0): 0})


def test_popularity_is_a_share_of_the_tasks() -> None:
    tasks = [TaskShape(1000, 500, 1)] * 97 + [TaskShape(8000, 1000, 4, memory_mib=65536)] * 3
    # FGD's 95%: the rare four-card shape is left out; every shape at 1.0
    assert TargetWorkload.from_tasks(tasks).shapes == (TaskShape(1000, 500, 1),)
    everything = TargetWorkload.from_tasks(tasks, popularity=1.0)
    assert dict(zip(everything.shapes, everything.weights, strict=True)) == pytest.approx(
        {TaskShape(1000, 500, 1): 0.97, TaskShape(8000, 1000, 4, memory_mib=65536): 0.03})
    for bad in (0.0, -0.5, 1.01):
        with pytest.raises(ValueError, match="popularity must be in"):
            TargetWorkload.from_tasks(tasks, popularity=bad)
