"""`fit.categories`: every failure's category once per node, whether nodes share one failure
object or not (the extender's unschedulable metric counts nodes by them)."""

from __future__ import annotations

from collections import Counter

from elastic_gpu.core.fit import FitFailure, FitKind, categories


def test_categories_count_every_node_once_shared_objects_included() -> None:
    shared = FitFailure(FitKind.INSUFFICIENT_CARDS, "nvidia.com/gpu", 2, 0, 4)
    model = FitFailure(FitKind.MODEL_NOT_ACCEPTED, offered=("T4",))
    equal_but_apart = FitFailure(FitKind.INSUFFICIENT_CARDS, "nvidia.com/gpu", 2, 0, 4)
    failures = [shared, model, shared, equal_but_apart, shared, FitFailure(FitKind.HOST_CPU)]
    assert Counter(categories(failures)) == Counter(f.category for f in failures)
    assert Counter(categories(failures)) == {"gpu": 4, "model": 1, "cpu": 1}
    assert list(categories([])) == []
