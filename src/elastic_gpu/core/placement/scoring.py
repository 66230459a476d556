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
from typing import overload

import numpy as np

from elastic_gpu.core.placement.layout import FloatArray, IntArray, Layout
from elastic_gpu.core.policies import CardPolicy, NodeArrays, NodePolicy, NodeView, ScoreContext
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
        #: insertion order is recency (a hit is moved to the end): a plain dict, whose values
        #: iterate without hashing keys (an OrderedDict's hash each key, a dataclass in Python,
        #: on every `forget_row`)
        self.cache: dict[tuple[str, TaskShape], FloatArray] = {}
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
        if not policy.uses_memory and task.memory_mib:
            task = task.without_memory()  # one cache entry for tasks that differ only in memory
        key = (policy.name, task)
        cached = self.cache.pop(key, None)
        if cached is None:
            if len(self.cache) >= SCORE_CACHE_LIMIT:
                oldest = next(iter(self.cache))  # the least recently used
                del self.cache[oldest], self._told[oldest]
            cached = np.full(len(lay.rows), np.nan)
            self._told[key] = self._changes
        else:
            self._catch_up(key, cached)
        self.cache[key] = cached  # now the most recently used
        values = cached[rows]
        missing = rows[np.isnan(values)]
        if missing.size:
            fresh = (policy.score_arrays(ctx, task, node_arrays(lay, missing))
                     if policy.cache_arrays and missing.size >= ARRAYS_FROM else None)
            cached[missing] = (fresh if fresh is not None else
                               policy.score_batch(ctx, task, _LazyViews(lay, missing.tolist())))
            values = cached[rows]
        return values
