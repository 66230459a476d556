"""The FGD fragmentation measure and the target workload."""

from __future__ import annotations

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
