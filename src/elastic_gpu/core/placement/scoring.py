"""Scoring: node policies by name, asked through their seam, and their scores cached.

A policy that scores from arrays (`NodePolicy.score_arrays`: binpack, spread) is asked once
per request over the whole card matrix. The others score node views; when their score depends
only on (node, task shape) it is cached per (policy, shape) and node, and a node's entries are
dropped whenever anything is allocated or released on it (through a log of changed rows each
entry catches up on when asked), so during a replay only the node that just changed is scored
again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from elastic_gpu.core.placement.layout import BoolArray, FloatArray, IntArray, Layout
from elastic_gpu.core.policies import (
    CardPolicy,
    HostThresholds,
    NodeArrays,
    NodePolicy,
    NodeView,
    ScoreContext,
)
from elastic_gpu.core.policies import card_policy as make_card_policy
from elastic_gpu.core.policies import node_policy as make_node_policy
from elastic_gpu.core.workload import TaskShape

#: score cache entries (policy, task shape) kept, the least recently used dropped first: one
#: entry is a float per node (120 KiB at 15,000 nodes), so pods that each ask their own CPU (a
#: new shape each) must not grow it far; a dropped shape costs one array pass when it comes
#: back (`ARRAYS_FROM`)
SCORE_CACHE_LIMIT = 512
#: node changes remembered for the cached entries (`Scorer.forget_row`): an entry not asked
#: since more changes than this were made is dropped whole when it is asked again
CHANGE_LOG = 4096
#: missing cached scores from which a policy with cached `score_arrays` is asked for arrays
#: rather than node views: below it, the few views (a node that just changed) cost less than
#: the array pass's fixed cost
ARRAYS_FROM = 8


class _LazyViews(Sequence[NodeView]):
    """Node views built only when a policy looks at them (random never does)."""

    def __init__(self, layout: Layout, rows: Sequence[int]) -> None:
        self._layout = layout
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> NodeView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[NodeView]: ...
    def __getitem__(self, i: int | slice) -> NodeView | Sequence[NodeView]:
        if isinstance(i, slice):
            return [self._layout.view(r) for r in self._rows[i]]
        return self._layout.view(self._rows[i])

    def __iter__(self) -> Iterator[NodeView]:
        return (self._layout.view(r) for r in self._rows)


def host_band(free: IntArray, asked: int, thresholds: IntArray) -> tuple[FloatArray, FloatArray]:
    """Per node, (low, high): the requests r with low < r <= high leave `free - r` on the same
    side of every threshold t (`free - r >= t`) as `asked` does, so a score that reads the
    request only through those comparisons (`HostThresholds`) is the same for all of them."""
    left = free - asked
    # thresholds[j-1] <= left < thresholds[j], with -inf before the first and +inf past the last
    j = np.searchsorted(thresholds, left, side="right")
    edges = np.concatenate(([-np.inf], thresholds.astype(np.float64), [np.inf]))
    room = free.astype(np.float64)  # exact: requests and amounts are far below 2**53
    low: FloatArray = room - edges[j + 1]
    high: FloatArray = room - edges[j]
    return low, high


@dataclass
class _Bands:
    """A cached entry's validity per node: the CPU (and memory) requests its score holds for."""

    cpu_low: FloatArray
    cpu_high: FloatArray
    memory_low: FloatArray
    memory_high: FloatArray

    @classmethod
    def empty(cls, n: int) -> _Bands:
        return cls(*(np.full(n, np.nan) for _ in range(4)))

    def holds(self, rows: IntArray, task: TaskShape, memory: bool) -> BoolArray:
        cpu = task.cpu_milli
        ok: BoolArray = (self.cpu_low[rows] < cpu) & (cpu <= self.cpu_high[rows])
        if memory:
            mib = task.memory_mib
            ok &= (self.memory_low[rows] < mib) & (mib <= self.memory_high[rows])
        return ok

    def set(self, lay: Layout, rows: IntArray, task: TaskShape, limits: HostThresholds) -> None:
        cpu_free = lay.cpu_cap[rows] - lay.cpu_used[rows]
        self.cpu_low[rows], self.cpu_high[rows] = host_band(cpu_free, task.cpu_milli, limits.cpu)
        if limits.memory is not None:
            memory_free = lay.mem_cap[rows] - lay.mem_used[rows]
            self.memory_low[rows], self.memory_high[rows] = host_band(
                memory_free, task.memory_mib, limits.memory)


def node_arrays(lay: Layout, rows: IntArray) -> NodeArrays:
    """The layout's matrices as a policy reads them (`NodeArrays`), for these rows."""
    return NodeArrays(rows, lay.cap_milli, lay.used_milli, lay.usable, lay.cpu_cap, lay.cpu_used,
                      lay.mem_cap, lay.mem_used, lay.exists, lay.card_model, lay.models)


class Scorer:
    """The policies in use, by name, and the node scores cached per (policy, task shape)."""

    def __init__(self, ctx: ScoreContext) -> None:
        self.ctx = ctx
        self._node_policies: dict[str, NodePolicy] = {}
        self._card_policies: dict[str, CardPolicy] = {}
        #: insertion order is recency (a hit is moved to the end)
        self.cache: dict[tuple[str, TaskShape], FloatArray] = {}
        #: the entries of policies that read the host requests only through thresholds
        #: (`HostThresholds`), keyed by the task's GPU half: for which requests each node's
        #: cached score holds
        self._bands: dict[tuple[str, TaskShape], _Bands] = {}
        #: per cache entry, the number of node changes (`_changes`) it has been told of
        self._told: dict[tuple[str, TaskShape], int] = {}
        #: the rows of the latest CHANGE_LOG node changes, a ring: change k is at k % CHANGE_LOG
        self._changed = np.zeros(CHANGE_LOG, dtype=np.int64)
        self._changes = 0

    def node_policy(self, name: str) -> NodePolicy:
        policy = self._node_policies.get(name)
        if policy is None:
            policy = self._node_policies[name] = make_node_policy(name)
        return policy

    def card_policy(self, name: str) -> CardPolicy:
        policy = self._card_policies.get(name)
        if policy is None:
            policy = self._card_policies[name] = make_card_policy(name)
        return policy

    def forget_row(self, row: int) -> None:
        """The node of this row changed: its cached scores are stale.

        Logged, not written into every entry: with pods that each ask their own CPU the cache
        holds hundreds of shapes, and marking each on every allocation was a walk over all of
        them per bind. An entry catches up on the log when it is asked (`_catch_up`)."""
        self._changed[self._changes % CHANGE_LOG] = row
        self._changes += 1
        for kept in self.ctx.row_memo.values():
            kept[row] = np.nan

    def _catch_up(self, key: tuple[str, TaskShape], cached: FloatArray) -> None:
        """Mark in `cached` the rows changed since it was last asked."""
        told = self._told.get(key, self._changes)
        behind = self._changes - told
        if behind > CHANGE_LOG:
            cached[:] = np.nan  # the log no longer reaches back that far
        elif behind:
            start, end = told % CHANGE_LOG, self._changes % CHANGE_LOG
            if start < end:
                cached[self._changed[start:end]] = np.nan
            else:  # the span wraps around the ring
                cached[self._changed[start:]] = np.nan
                cached[self._changed[:end]] = np.nan
        self._told[key] = self._changes

    def clear(self) -> None:
        """The rows were renumbered (or the workload changed): nothing cached holds."""
        self.cache.clear()
        self._told.clear()
        self._bands.clear()
        self.ctx.row_memo.clear()

    def scores(self, lay: Layout, policy: NodePolicy, task: TaskShape, rows: IntArray
               ) -> FloatArray:
        """The policy's score of each of `rows` for a task of this shape (higher is better)."""
        ctx = self.ctx
        if not policy.cache_arrays:
            vectorised = policy.score_arrays(ctx, task, node_arrays(lay, rows))
            if vectorised is not None:
                return vectorised
        if not policy.cacheable:
            return np.array(policy.score_batch(ctx, task, _LazyViews(lay, rows.tolist())),
                            dtype=np.float64)
        limits = policy.host_thresholds(ctx, task)
        if limits is None and not policy.uses_memory and task.memory_mib:
            task = task.without_memory()  # one cache entry for tasks that differ only in memory
        # Pods that each ask their own CPU are each a new shape; where the score reads the
        # host requests only through thresholds, one entry serves them all (`_Bands`).
        key = (policy.name, task if limits is None else
               TaskShape(0, task.gpu_milli, task.gpu_count, task.models))
        cached = self.cache.pop(key, None)
        if cached is None:
            if len(self.cache) >= SCORE_CACHE_LIMIT:
                oldest = next(iter(self.cache))  # the least recently used
                del self.cache[oldest], self._told[oldest]
                self._bands.pop(oldest, None)
            cached = np.full(len(lay.rows), np.nan)
            self._told[key] = self._changes
        else:
            self._catch_up(key, cached)
        self.cache[key] = cached  # now the most recently used
        values = cached[rows]
        known = ~np.isnan(values)
        bands: _Bands | None = None
        if limits is not None:
            bands = self._bands.get(key)
            if bands is None:
                bands = self._bands[key] = _Bands.empty(len(lay.rows))
            known &= bands.holds(rows, task, limits.memory is not None)
        missing = rows[~known]
        if missing.size:
            if bands is not None and limits is not None:
                bands.set(lay, missing, task, limits)
            fresh = (policy.score_arrays(ctx, task, node_arrays(lay, missing))
                     if policy.cache_arrays and missing.size >= ARRAYS_FROM else None)
            cached[missing] = (fresh if fresh is not None else
                               policy.score_batch(ctx, task, _LazyViews(lay, missing.tolist())))
            values = cached[rows]
        return values
