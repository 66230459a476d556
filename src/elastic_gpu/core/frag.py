"""GPU fragmentation of a node against a target workload (the FGD measure).

Definitions (Weng et al., ATC'23, and the authors' simulator): for a node with free compute
`left_i` on card i and free CPU `cpu`, and a task shape t with probability p_t,
- if t can run on the node (enough cards with `left_i >= t.milli`, enough CPU, model accepted),
  the fragment t sees is the free compute on the cards too small for it: sum of left_i < t.milli;
- otherwise (lacks GPU, lacks CPU, wrong model, or t asks for no GPU at all) all free compute is
  a fragment for t.
The node's fragmentation is the expectation sum_t p_t * fragment_t, in milli-cards. The cluster's
fragmentation rate is total fragmentation over total free compute.

A node's value depends only on (model, free CPU, multiset of free compute per card), so values
are memoised on that key: in a replay the same states recur constantly.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from elastic_gpu.core.workload import DEFAULT_CPU_REQUEST, TargetWorkload

#: model, free CPU (milli), free compute per usable card sorted descending
StateKey = tuple[str, int, tuple[int, ...]]


@dataclass(frozen=True)
class _Group:
    """Task shapes that differ only in CPU: they share the GPU half of the test."""

    milli: int
    count: int
    models: frozenset[str]
    cpus: tuple[int, ...]  # ascending
    cumulative: tuple[float, ...]  # cumulative probability along `cpus`

    def weight_fitting_cpu(self, cpu_free: int) -> float:
        k = bisect_right(self.cpus, cpu_free)
        return self.cumulative[k - 1] if k else 0.0


class Fragmentation:
    """Expected fragmentation of node states against one target workload, memoised."""

    def __init__(self, workload: TargetWorkload, memo_limit: int = 2_000_000) -> None:
        self.workload = workload
        groups: dict[tuple[int, int, frozenset[str]], list[tuple[int, float]]] = {}
        for shape, weight in zip(workload.shapes, workload.weights, strict=True):
            if shape.gpu_count == 0 or shape.gpu_milli == 0:
                continue  # CPU-only shapes: every free milli-card is a fragment for them
            key = (shape.gpu_milli, shape.gpu_count, shape.models)
            groups.setdefault(key, []).append((max(shape.cpu_milli, DEFAULT_CPU_REQUEST), weight))
        self._groups = []
        for (milli, count, models), items in sorted(groups.items(), key=lambda kv: kv[0][:2]):
            items.sort()
            self._groups.append(_Group(milli, count, models, tuple(c for c, _ in items),
                                       tuple(accumulate(w for _, w in items))))
        self._memo: dict[StateKey, float] = {}
        self._memo_limit = memo_limit

    def node(self, model: str, cpu_free: int, free: tuple[int, ...]) -> float:
        """Expected fragment (milli-cards) of a node; `free` must be sorted descending."""
        key = (model, cpu_free, free)
        value = self._memo.get(key)
        if value is None:
            value = self._compute(model, cpu_free, free)
            if len(self._memo) >= self._memo_limit:
                self._memo.clear()  # bounded memory; values are cheap to recompute
            self._memo[key] = value
        return value

    def _compute(self, model: str, cpu_free: int, free: tuple[int, ...]) -> float:
        total = sum(free)
        if total == 0:
            return 0.0
        q3_weight = 0.0
        q3_small = 0.0
        for group in self._groups:
            if group.models and model not in group.models:
                continue
            # `free` is sorted descending: the card with index count-1 is the count-th largest.
            if len(free) < group.count or free[group.count - 1] < group.milli:
                continue
            weight = group.weight_fitting_cpu(cpu_free)
            if weight == 0.0:
                continue
            small = 0
            for left in reversed(free):
                if left >= group.milli:
                    break
                small += left
            q3_weight += weight
            q3_small += weight * small
        return total * (1.0 - q3_weight) + q3_small


def sorted_free(free: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(free, reverse=True))


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)
