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
        #: the groups as arrays, for `nodes_array`
        self._steps = _GroupArrays.of(self._groups)
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
        scalar order (a shape's items in turn, then the groups in turn: running sums along an
        axis, `cumsum`, which adds left to right, unlike `sum`'s pairwise order; an item or
        group that does not count adds 0.0, which leaves a double as it was). Every group at
        once, a column each: a loop over the groups cost ~10 NumPy calls a group, and a filter
        of 420 nodes spent ~250 us here, nearly all of it the calls' own overhead. Nothing is
        memoised here (`fgd_arrays` keeps each node's value while the node is unchanged), but
        equal states are computed once (`_unique_states`)."""
        unique = _unique_states(model_ids, cpu_free, memory_free, free)
        if unique is None:
            return self._states_array(models, model_ids, cpu_free, memory_free, free)
        first, inverse = unique
        values = self._states_array(models, model_ids[first], cpu_free[first],
                                    None if memory_free is None else memory_free[first],
                                    free[first])
        out: npt.NDArray[np.float64] = values[inverse]
        return out

    def _states_array(self, models: Sequence[str], model_ids: npt.NDArray[np.int64],
                      cpu_free: npt.NDArray[np.int64],
                      memory_free: npt.NDArray[np.int64] | None,
                      free: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        n, width = free.shape
        steps = self._steps
        counted = free >= 0
        owned = free * counted
        total = owned.sum(axis=1)
        if n == 0 or not steps.millis.size:
            return np.where(total == 0, 0.0, total.astype(np.float64))
        # (n, groups): the GPU half of the test (a group needing more cards than the rows
        # have fits nowhere), and the model's
        fits = ((free[:, np.minimum(steps.counts, width) - 1] >= steps.millis)
                & (steps.counts <= width))
        if steps.restricted.any():
            allowed = np.array([[not g.models or m in g.models for g in self._groups]
                                for m in models], dtype=bool).reshape(len(models), -1)
            fits &= allowed[np.asarray(model_ids)]
        if memory_free is None:  # the probability of the shapes whose CPU fits, per group:
            # every group's CPU requests in one sorted array, a group's after the one before
            cpu = (cpu_free if steps.cpu_ranks is None else
                   np.searchsorted(steps.cpu_ranks, cpu_free, side="right"))
            query = np.clip(cpu, 0, steps.cpu_ceiling)[:, None] + steps.cpu_offset
            below = np.searchsorted(steps.cpu_keys, query, side="right") - steps.cpu_start
            weight = steps.cumulative[below + steps.cumulative_start]
        else:  # each item's probability where its CPU and memory fit, added in item order
            weight = np.zeros(fits.shape)
            for item, columns in enumerate(steps.item_columns):  # the groups with an item-th
                cpus, memories, probabilities = steps.items[item]
                added = np.where((cpu_free[:, None] >= cpus) & (memory_free[:, None] >= memories),
                                 probabilities, 0.0)
                if columns is None:
                    weight = weight + added
                else:
                    weight[:, columns] = weight[:, columns] + added
        weight = np.where(fits & (weight != 0.0), weight, 0.0)
        # the compute on cards too small for each group (integers: any order is exact)
        small = np.stack([np.where(free < milli, owned, 0).sum(axis=1)
                          for milli in steps.distinct_millis.tolist()], axis=1)
        small = small[:, steps.milli_index]
        q3_weight = weight.cumsum(axis=1)[:, -1]
        q3_small = (weight * small).cumsum(axis=1)[:, -1]
        out: npt.NDArray[np.float64] = np.where(total == 0, 0.0,
                                                total * (1.0 - q3_weight) + q3_small)
        return out


#: Fewer states than this are computed as they are (finding the equal ones costs more).
UNIQUE_FROM = 32
#: Odd multipliers (a fixed draw) folding a state's numbers into one int64 (`_unique_states`).
_FOLD = np.random.default_rng(0x5EED).integers(1, 2 ** 62, size=64, dtype=np.int64) | 1


def _unique_states(model_ids: npt.NDArray[np.int64], cpu_free: npt.NDArray[np.int64],
                   memory_free: npt.NDArray[np.int64] | None, free: npt.NDArray[np.int64]
                   ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
    """The first of each set of equal states and each state's set (`np.unique`'s index and
    inverse), or None when there are few states, or few equal ones. Empty nodes of one
    kind leave equal states (a filter's 420 candidates were often a few dozen distinct
    ones): the measure is computed once for each. States are folded into one number
    each, and states with equal numbers are then compared whole: a fold that maps two
    different states together only costs the saving, never a wrong value."""
    n = free.shape[0]
    if n < UNIQUE_FROM or free.shape[1] + 3 > _FOLD.size:
        return None
    columns = [model_ids, cpu_free] + ([] if memory_free is None else [memory_free])
    state = np.column_stack([*columns, free]).astype(np.int64, copy=False)
    folded = state @ _FOLD[:state.shape[1]]  # wraps around: a hash, checked below
    _, first, inverse = np.unique(folded, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if first.size > n * 3 // 4 or not (state[first][inverse] == state).all():
        return None
    return first, inverse


@dataclass(frozen=True)
class _GroupArrays:
    """The groups of a `Fragmentation` as arrays, a column per group, for `nodes_array`."""

    millis: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    #: whether the group names models (the others accept every model)
    restricted: npt.NDArray[np.bool_]
    #: the groups' distinct `millis`, and each group's among them
    distinct_millis: npt.NDArray[np.int64]
    milli_index: npt.NDArray[np.int64]
    #: every group's CPU requests in one array, group g's as `g * stride + cpu` with `stride`
    #: past the largest request (ascending throughout); `cpu_offset[g]` is `g * stride` and
    #: `cpu_start[g]` where its requests begin. Free CPU is clipped to `cpu_ceiling`, the
    #: largest request (no more of them fit above it), and to 0 (requests are positive)
    #: the distinct CPU requests, ascending, where the keys are their ranks (1 the lowest):
    #: free CPU is then its count of requests at or below it (None: the keys are the requests)
    cpu_ranks: npt.NDArray[np.int64] | None
    cpu_ceiling: int
    cpu_keys: npt.NDArray[np.int64]
    cpu_offset: npt.NDArray[np.int64]
    cpu_start: npt.NDArray[np.int64]
    #: per group, before each of its CPU requests the cumulative probability of the ones below
    #: (0.0 first) and after the last the whole group's, the groups one after another
    cumulative: npt.NDArray[np.float64]
    cumulative_start: npt.NDArray[np.int64]
    #: the groups' i-th items: the groups that have one (None: every group), and their CPU,
    #: memory and probability (a group's items in order)
    item_columns: list[npt.NDArray[np.int64] | None]
    items: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]]

    @classmethod
    def of(cls, groups: Sequence[_Group]) -> _GroupArrays:
        millis = np.array([g.milli for g in groups], dtype=np.int64)
        distinct_millis, milli_index = np.unique(millis, return_inverse=True)
        # every key must fit int64: a workload with requests near the edge's limit (2^53
        # milli-CPU) in many groups is indexed by the ranks of its requests instead, which
        # keeps each request's order with every other and with any free CPU (`cpu_ranks`)
        requests = sorted({cpu for g in groups for cpu in g.cpus})
        ranked = len(groups) * (max(requests, default=0) + 1) >= 2 ** 62
        rank = {cpu: i + 1 for i, cpu in enumerate(requests)}
        cpus_of = [[rank[c] if ranked else c for c in g.cpus] for g in groups]
        ceiling = max((max(c) for c in cpus_of if c), default=0)
        offsets = np.arange(len(groups), dtype=np.int64) * (ceiling + 1)
        cpu_keys = np.concatenate([np.zeros(0, dtype=np.int64)] + [
            offset + np.array(c, dtype=np.int64) for c, offset in zip(cpus_of, offsets,
                                                                      strict=True)])
        sizes = np.array([len(g.cpus) for g in groups], dtype=np.int64)
        cumulative = np.concatenate([np.zeros(0)] + [np.array((0.0, *g.cumulative))
                                                      for g in groups])
        item_columns: list[npt.NDArray[np.int64] | None] = []
        items: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                          npt.NDArray[np.float64]]] = []
        for item in range(max((len(g.items) for g in groups), default=0)):
            having = [column for column, g in enumerate(groups) if len(g.items) > item]
            item_columns.append(None if len(having) == len(groups) else
                                np.array(having, dtype=np.int64))
            items.append((np.array([groups[c].items[item][0] for c in having], dtype=np.int64),
                          np.array([groups[c].items[item][1] for c in having], dtype=np.int64),
                          np.array([groups[c].items[item][2] for c in having])))
        return cls(millis, np.array([g.count for g in groups], dtype=np.int64),
                   np.array([bool(g.models) for g in groups], dtype=bool),
                   distinct_millis, milli_index.reshape(-1),
                   np.array(requests, dtype=np.int64) if ranked else None, ceiling,
                   cpu_keys, offsets, np.cumsum(sizes) - sizes,
                   cumulative, np.cumsum(sizes + 1) - (sizes + 1),
                   item_columns, items)


def sorted_free(free: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(free, reverse=True))


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)
