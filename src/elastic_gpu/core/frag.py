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

`node_with_memory` is the same measure with host memory in the fit test too: a task shape whose
memory request exceeds the node's free memory cannot run there, so all free compute is a fragment
for it. FGD and the authors' simulator leave memory out; fgdx-mem (docs/simulator.md) puts it in.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import numpy.typing as npt

from elastic_gpu.core.workload import DEFAULT_CPU_REQUEST, TargetWorkload

#: model, free CPU (milli), free compute per usable card sorted descending
StateKey = tuple[str, int, tuple[int, ...]]
#: the same with free memory (MiB) after the CPU
MemoryStateKey = tuple[str, int, int, tuple[int, ...]]


@dataclass(frozen=True)
class _Group:
    """Task shapes that differ only in CPU: they share the GPU half of the test."""

    milli: int
    count: int
    models: frozenset[str]
    cpus: tuple[int, ...]  # ascending
    cumulative: tuple[float, ...]  # cumulative probability along `cpus`
    #: (CPU, memory, probability) of every shape of the group, CPU ascending
    items: tuple[tuple[int, int, float], ...]

    def fragment_if_fits(self, free: tuple[int, ...]) -> int:
        """The free compute on cards too small for this group (`free` sorted descending)."""
        small = 0
        for left in reversed(free):
            if left >= self.milli:
                break
            small += left
        return small

    def weight_fitting_cpu(self, cpu_free: int) -> float:
        k = bisect_right(self.cpus, cpu_free)
        return self.cumulative[k - 1] if k else 0.0

    def weight_fitting(self, cpu_free: int, memory_free: int) -> float:
        weight = 0.0
        for cpu, memory, probability in self.items:
            if cpu > cpu_free:
                break
            if memory <= memory_free:
                weight += probability
        return weight


class Fragmentation:
    """Expected fragmentation of node states against one target workload, memoised."""

    def __init__(self, workload: TargetWorkload, memo_limit: int = 2_000_000) -> None:
        self.workload = workload
        groups: dict[tuple[int, int, frozenset[str]], list[tuple[int, int, float]]] = {}
        for shape, weight in zip(workload.shapes, workload.weights, strict=True):
            if shape.gpu_count == 0 or shape.gpu_milli == 0:
                continue  # CPU-only shapes: every free milli-card is a fragment for them
            key = (shape.gpu_milli, shape.gpu_count, shape.models)
            groups.setdefault(key, []).append(
                (max(shape.cpu_milli, DEFAULT_CPU_REQUEST), shape.memory_mib, weight))
        self._groups = []
        for (milli, count, models), items in sorted(groups.items(), key=lambda kv: kv[0][:2]):
            items.sort()
            # memory-blind: one entry per CPU request (a shape split over memory sums back)
            by_cpu: dict[int, float] = {}
            for cpu, _, weight in items:
                by_cpu[cpu] = by_cpu.get(cpu, 0.0) + weight
            self._groups.append(_Group(milli, count, models, tuple(by_cpu),
                                       tuple(accumulate(by_cpu.values())), tuple(items)))
        self._memo: dict[StateKey, float] = {}
        self._memory_memo: dict[MemoryStateKey, float] = {}
        self._memo_limit = memo_limit
        #: per group, for `nodes_array`: its CPU requests and, before each, the cumulative
        #: probability of the ones below (0.0 first)
        self._cpu_steps = [(np.array(g.cpus, dtype=np.int64), np.array((0.0, *g.cumulative)))
                           for g in self._groups]
        #: for `host_thresholds`: every CPU and every memory request of the shapes' items
        self._host_cpus = np.array(sorted({c for g in self._groups for c, _, _ in g.items}),
                                   dtype=np.int64)
        self._host_memories = np.array(sorted({m for g in self._groups for _, m, _ in g.items}),
                                       dtype=np.int64)

    def host_thresholds(self, with_memory: bool
                        ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """The values the measure compares a state's free CPU (and, `with_memory`, free memory)
        with, ascending: `node` reads free CPU only through `free CPU >= t` for these t (and
        `node_with_memory` free memory likewise), so states whose free CPU lies between the
        same two of them have the same value."""
        return self._host_cpus, self._host_memories if with_memory else None

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

    def node_with_memory(self, model: str, cpu_free: int, memory_free: int,
                         free: tuple[int, ...]) -> float:
        """`node` with each shape's host memory in the fit test too; `free` sorted descending."""
        key = (model, cpu_free, memory_free, free)
        value = self._memory_memo.get(key)
        if value is None:
            value = self._compute(model, cpu_free, free, memory_free)
            if len(self._memory_memo) >= self._memo_limit:
                self._memory_memo.clear()
            self._memory_memo[key] = value
        return value

    def _compute(self, model: str, cpu_free: int, free: tuple[int, ...],
                 memory_free: int | None = None) -> float:
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
            weight = (group.weight_fitting_cpu(cpu_free) if memory_free is None
                      else group.weight_fitting(cpu_free, memory_free))
            if weight == 0.0:
                continue
            small = group.fragment_if_fits(free)
            q3_weight += weight
            q3_small += weight * small
        return total * (1.0 - q3_weight) + q3_small


    def nodes_array(self, models: Sequence[str], model_ids: npt.NDArray[np.int64],
                    cpu_free: npt.NDArray[np.int64], memory_free: npt.NDArray[np.int64] | None,
                    free: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """`node` (`memory_free` None) or `node_with_memory` of many states at once.

        State i is a node of model `models[model_ids[i]]` with `cpu_free[i]` (and
        `memory_free[i]`) and the free compute of its usable cards in row i of `free`, sorted
        descending, padded with -1 past its cards. The same IEEE doubles as `_compute` state by
        state: the fragments are integers, and weights and weighted fragments are added in the
        scalar order (a shape's items in turn, then the groups in turn; an item or group that
        does not count adds 0.0, which leaves a double as it was). Nothing is memoised here
        (`fgd_arrays` keeps each node's value while the node is unchanged)."""
        n, width = free.shape
        counted = free >= 0
        total = (free * counted).sum(axis=1)
        q3_weight = np.zeros(n)
        q3_small = np.zeros(n)
        small: dict[int, npt.NDArray[np.int64]] = {}
        model_ok = {m: np.asarray(model_ids) == i for i, m in enumerate(models)}
        for group, (cpus, cumulative) in zip(self._groups, self._cpu_steps, strict=True):
            if group.count > width:
                continue
            fits = free[:, group.count - 1] >= group.milli
            if group.models:
                for name, rows in model_ok.items():
                    if name not in group.models:
                        fits &= ~rows
            if not fits.any():
                continue
            if memory_free is None:
                weight = cumulative[np.searchsorted(cpus, cpu_free, side="right")]
            else:
                weight = np.zeros(n)
                for cpu, memory, probability in group.items:
                    weight = weight + np.where((cpu_free >= cpu) & (memory_free >= memory),
                                               probability, 0.0)
            weight = np.where(fits & (weight != 0.0), weight, 0.0)
            fragment = small.get(group.milli)
            if fragment is None:  # the compute on cards too small for the group (integers)
                fragment = small[group.milli] = (free * (counted & (free < group.milli))
                                                 ).sum(axis=1)
            q3_weight = q3_weight + weight
            q3_small = q3_small + weight * fragment
        out: npt.NDArray[np.float64] = np.where(total == 0, 0.0,
                                                total * (1.0 - q3_weight) + q3_small)
        return out


def sorted_free(free: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(free, reverse=True))


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)
