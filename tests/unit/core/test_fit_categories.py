"""`fit.category_counts`: every failure's category counted once per node, whether nodes share one failure
object or not (the extender's unschedulable metric counts nodes by them)."""

from __future__ import annotations

from collections import Counter

from elastic_gpu.core.fit import FitFailure, FitKind, category_counts
from elastic_gpu.scheduler.metrics import main_reason


def test_categories_count_every_node_once_shared_objects_included() -> None:
    shared = FitFailure(FitKind.INSUFFICIENT_CARDS, "nvidia.com/gpu", 2, 0, 4)
    model = FitFailure(FitKind.MODEL_NOT_ACCEPTED, offered=("T4",))
    equal_but_apart = FitFailure(FitKind.INSUFFICIENT_CARDS, "nvidia.com/gpu", 2, 0, 4)
    failures = [shared, model, shared, equal_but_apart, shared, FitFailure(FitKind.HOST_CPU)]
    assert category_counts(failures) == Counter(f.category for f in failures)
    assert category_counts(failures) == {"gpu": 4, "model": 1, "cpu": 1}
    assert category_counts([]) == {}


def test_the_main_reason_of_counts_is_the_main_reason_of_the_nodes() -> None:
    per_node = ["model", "cpu", "model", "cpu", "gpu"]  # a tie: the alphabetically first
    assert main_reason(Counter(per_node)) == main_reason(per_node) == "cpu"
    assert main_reason(Counter()) == main_reason([]) == "none"
