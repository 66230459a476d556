"""The defragmentation planner: the fewest moves of placed pods that let a pending pod fit.

`plan_moves` ranks candidate move sets cheaply (`candidates`) and checks each in the engine
itself, in order of fewest moves and then least compute moved: the set's pods are released
one by one, each placed again by the engine's own fit and scoring (`Engine.best` then
`Engine.assign`, what `Engine.place` does) among the other nodes, so every move truly moves,
and then the pending pod must be placed. The first set that passes is the plan. Every trial is
undone, on success, failure or exception alike, and the engine's random source is restored, so
the engine is left as it was found. Pure: no I/O; the caller decides what is movable (owner,
opt-in, priority, cool-down) and carries the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.defrag.candidates import (
    MoveSet,
    move_sets,
    pods_on,
    rank_nodes,
    single_gpu_container,
)
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.request import PodRequest

#: move sets checked in the engine per call, at most: bounds one call on a large cluster
MAX_TRIALS = 48


@dataclass(frozen=True)
class Move:
    pod_key: str  # the engine's key of the moved (placed) pod
    source: Assignment  # where it was
    target: Assignment  # where the plan puts it


@dataclass(frozen=True)
class DefragPlan:
    pod_key: str  # the pending pod the plan makes room for
    placement: Assignment  # where that pending pod goes once the moves are done
    moves: tuple[Move, ...]  # fewest moves first found; len <= max_moves


def plan_moves(engine: Engine, pending_key: str, pending: PodRequest,
               movable: Mapping[str, PodRequest], max_moves: int, *,
               policy: str | None = None) -> DefragPlan | None:
    """The fewest moves (at most `max_moves`) of `movable` placed pods after which `pending`
    fits, each move and the final placement chosen by the engine's fit and scoring (`policy`:
    the node policy, else the pod's or the engine's); None when no plan is found. Plans only a
    pod with one share or whole-card container (MIG and several GPU containers: None). The
    engine is left as it was."""
    container = single_gpu_container(pending)
    if max_moves <= 0 or container is None or engine.allocation(pending_key) is not None:
        return None
    check_host = engine.config.check_host_resources
    free = engine.free_cards(pending)
    rows = rank_nodes(free, pending, container, max_moves, check_host)
    if not rows:
        return None
    placed = pods_on({free.names[r] for r in rows}, movable, engine.allocation, pending_key)
    sets: list[MoveSet] = []
    for order, row in enumerate(rows):
        name = free.names[row]
        if name not in placed:
            continue
        indices = [index for index, _, _ in engine.card_usage(name)]
        sets.extend(move_sets(free, row, order, pending, container, placed[name], movable,
                              indices, max_moves, check_host))
    sets.sort(key=MoveSet.sort_key)
    if not sets:
        return None
    rng_state = engine.ctx.rng.bit_generator.state
    try:
        for candidate in sets[:MAX_TRIALS]:
            found = _trial(engine, candidate, pending_key, pending, movable, free.names, policy)
            if found is not None:
                return found
        return None
    finally:
        engine.ctx.rng.bit_generator.state = rng_state


def _trial(engine: Engine, candidate: MoveSet, pending_key: str, pending: PodRequest,
           movable: Mapping[str, PodRequest], names: Sequence[str], policy: str | None
           ) -> DefragPlan | None:
    """Run one move set in the engine and undo it: the plan if every moved pod is placed on
    another node and then the pending pod fits."""
    others = [n for n in names if n != candidate.node]
    released: list[tuple[str, Assignment]] = []
    done: list[Move] = []
    try:
        for key in candidate.keys:
            pod = movable[key]
            source = engine.release(key)
            if source is None:
                return None
            released.append((key, source))
            node = engine.best(pod, others, policy)
            if node is None:
                return None
            target = engine.assign(pod, node)
            engine.allocate(key, target, pod)
            done.append(Move(key, source, target))
        node = engine.best(pending, names, policy)
        if node is None:
            return None
        return DefragPlan(pending_key, engine.assign(pending, node), tuple(done))
    except Unschedulable:
        return None
    finally:
        for move in reversed(done):
            engine.release(move.pod_key)
        for key, source in reversed(released):
            engine.allocate(key, source, movable[key])
