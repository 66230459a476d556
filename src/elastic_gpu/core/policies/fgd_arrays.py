"""FGD's node scores for many nodes in one NumPy pass: fgd, fgdx, fgdx-mem, fgdx-auto, fgdx-cpufit.

Node by node (`node.FgdPolicy.score` and its subclasses) a score costs tens of microseconds of
Python: the node's view, every card state the task can leave (`node.free_after`), and the
fragmentation of each state against the target workload. The engine caches scores per task
shape, which serves a stream of identical pods; but pods that differ in one CPU request are
each a new shape, and the extender then scored the ~500 nodes of every request one by one (most
of kube-scheduler's time per pod with distinct pods: docs/benchmarks.md, issue 29). Here every
state of every node is a row of one matrix and the same arithmetic runs over all of them.

The scores are the same IEEE doubles as node by node (a test compares them on random clusters):
integer quantities stay integers, the fragmentation adds in the scalar order
(`Fragmentation.nodes_array`), and the one transcendental step, FGD's sigmoid, is computed by the
scalar code itself over the distinct values (NumPy's `exp` may differ from `math.exp` in the last
bit, which the integer truncation after it could turn into a different score).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from elastic_gpu.core.frag import sigmoid
from elastic_gpu.core.policies.base import NodeArrays, ScoreContext
from elastic_gpu.core.resources import MILLI_PER_CARD
from elastic_gpu.core.workload import TaskShape

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MAX_SCORE = 100


@dataclass(frozen=True)
class States:
    """The card states a task can leave (`node.free_after`), one per row: `owner` is the
    position (into `NodeArrays.rows`) of the node it belongs to, `free` its free compute per
    usable card sorted descending (-1 past the node's cards)."""

    owner: IntArray
    free: IntArray

    @property
    def total(self) -> IntArray:
        total: IntArray = (self.free * (self.free >= 0)).sum(axis=1)
        return total


def descending(free: IntArray) -> IntArray:
    """Each row sorted descending, the -1 padding last."""
    out: IntArray = -np.sort(-free, axis=1)
    return out


def states_after(task: TaskShape, free: IntArray) -> States:
    """`node.free_after` for every node (rows of `free`, `NodeArrays.card_free`) at once,
    states in node order."""
    n = free.shape[0]
    if task.gpu_count == 0 or task.gpu_milli == 0:
        return States(np.arange(n), descending(free))
    if task.is_share:
        owner, column = np.nonzero(free >= task.gpu_milli)
        # one state per distinct room on a node, as the scalar code keeps (cards with equal
        # room leave equal states): the first card of each (node, room)
        room = free[owner, column]
        _, first = np.unique(owner * (int(free.max(initial=0)) + 1) + room, return_index=True)
        owner, column = owner[first], column[first]
        after = free[owner]
        after[np.arange(owner.size), column] -= task.gpu_milli
        return States(owner.astype(np.int64), descending(after))
    if task.gpu_milli < MILLI_PER_CARD:
        return share_runs(task, free)
    # whole cards: the lowest-indexed entirely free ones
    whole = free >= MILLI_PER_CARD
    taken = whole & (np.cumsum(whole, axis=1) <= task.gpu_count)
    owner = np.flatnonzero(taken.sum(axis=1) == task.gpu_count)
    return States(owner, descending(np.where(taken, 0, free)[owner]))


def share_runs(task: TaskShape, free: IntArray) -> States:
    """`node.share_runs_after` for every node: its cards sorted by free room (descending; the
    cards with room are a prefix), and each run of `gpu_count` consecutive cards with room
    taking the share; states node by node, each node's runs from the loosest on."""
    count, milli = task.gpu_count, task.gpu_milli
    ranked = descending(free)
    room = (ranked >= milli).sum(axis=1)
    owners: list[IntArray] = []
    frees: list[IntArray] = []
    for j in range(ranked.shape[1] - count + 1):
        owner = np.flatnonzero(room >= j + count)
        if not owner.size:
            break
        after = ranked[owner]
        after[:, j:j + count] -= milli
        owners.append(owner)
        frees.append(after)
    if not owners:
        return States(np.zeros(0, dtype=np.int64), np.zeros((0, free.shape[1]), dtype=np.int64))
    owner_all = np.concatenate(owners)
    order = np.argsort(owner_all, kind="stable")
    return States(owner_all[order].astype(np.int64), descending(np.concatenate(frees)[order]))


def fgd_values(before: FloatArray, after: FloatArray) -> IntArray:
    """FGD's integer score of each state, `int(sigmoid((before - after) / 1000) * 100)`, the
    sigmoid evaluated by the scalar code once per distinct argument."""
    x = (before - after) / 1000
    distinct, where = np.unique(x, return_inverse=True)
    scored = np.array([int(sigmoid(v) * MAX_SCORE) for v in distinct.tolist()], dtype=np.int64)
    out: IntArray = scored[where.reshape(-1)]
    return out


def best_per_node(n: int, owner: IntArray, values: IntArray) -> FloatArray:
    """The best value of each node's states, 0 for a node that has none."""
    best = np.full(n, -1, dtype=np.int64)
    np.maximum.at(best, owner, values)
    out: FloatArray = np.where(best < 0, 0, best).astype(np.float64)
    return out


@dataclass(frozen=True)
class Scored:
    """One scoring pass: each node's best FGD value, and what fgdx-auto's balance reads."""

    best: FloatArray
    states: States
    #: per state: the fragmentation it leaves (milli-cards)
    after: FloatArray


def fgd_pass(ctx: ScoreContext, task: TaskShape, nodes: NodeArrays, with_memory: bool) -> Scored:
    """FGD's score (`FgdPolicy.score`; with host memory in the fit test, fgdx-mem's
    `memory_fgd_states`) of every node, with the states behind it."""
    free = nodes.card_free
    models, model_ids = nodes.model
    cpu_free = nodes.cpu_free
    memory_free = nodes.memory_free if with_memory else None
    frag = ctx.frag
    # A node's fragmentation now is the same for every task: kept per row until it changes.
    kept = ctx.memo("fgd-before-memory" if with_memory else "fgd-before",
                    nodes.cpu_capacity.shape[0])
    before = kept[nodes.rows]
    unknown = np.flatnonzero(np.isnan(before))
    if unknown.size:
        fresh = frag.nodes_array(models, model_ids[unknown], cpu_free[unknown],
                                 memory_free[unknown] if memory_free is not None else None,
                                 descending(free[unknown]))
        before[unknown] = fresh
        kept[nodes.rows[unknown]] = fresh
    states = states_after(task, free)
    owner = states.owner
    cpu_after = cpu_free[owner] - task.cpu_milli
    memory_after = memory_free[owner] - task.memory_mib if memory_free is not None else None
    after = frag.nodes_array(models, model_ids[owner], cpu_after, memory_after, states.free)
    values = fgd_values(before[owner], after)
    return Scored(best_per_node(free.shape[0], owner, values), states, after)


def is_cpu_only(task: TaskShape) -> bool:
    return task.gpu_count == 0 or task.gpu_milli == 0


def fgd(ctx: ScoreContext, task: TaskShape, nodes: NodeArrays) -> FloatArray:
    """`FgdPolicy.score` of every node."""
    if task.cpu_milli == 0 and task.total_milli == 0:
        return np.full(nodes.rows.size, float(MAX_SCORE))
    return fgd_pass(ctx, task, nodes, with_memory=False).best


def fgdx(ctx: ScoreContext, task: TaskShape, nodes: NodeArrays, max_spec_gpu: int) -> FloatArray:
    """`FgdxPolicy.score`: FGD, CPU-only tasks preferring the nodes with the least idle GPU."""
    base = fgd(ctx, task, nodes)
    if is_cpu_only(task):
        out: FloatArray = base - 1e-3 * nodes.free_total / max_spec_gpu
        return out
    return base


def fgdx_memory(ctx: ScoreContext, task: TaskShape, nodes: NodeArrays, max_spec_gpu: int
                ) -> FloatArray:
    """`FgdxMemoryPolicy.score`: GPU tasks by FGD with host memory in the fit test."""
    if is_cpu_only(task):
        return fgdx(ctx, task, nodes, max_spec_gpu)
    return fgd_pass(ctx, task, nodes, with_memory=True).best


def fgdx_balanced(ctx: ScoreContext, task: TaskShape, nodes: NodeArrays, ratio: float,
                  weight: float, max_spec_cpu: int) -> FloatArray:
    """`FgdxAutoPolicy.score` for a GPU task under CPU pressure: the best FGD value less
    `weight` times the least CPU imbalance (`node.cpu_imbalance`) of the node's states."""
    scored = fgd_pass(ctx, task, nodes, with_memory=True)
    owner = scored.states.owner
    cpu_left = nodes.cpu_free[owner] - task.cpu_milli
    usable = scored.states.total - scored.after
    imbalance = np.minimum(np.abs(cpu_left - ratio * usable) / max_spec_cpu, 1.0)
    least = np.full(nodes.rows.size, np.inf)
    np.minimum.at(least, owner, imbalance)
    has_state = np.zeros(nodes.rows.size, dtype=bool)
    has_state[owner] = True
    out: FloatArray = np.where(has_state, scored.best - weight * least, 0.0)
    return out
