"""The defragmentation planner: the fewest moves of placed pods that let a pending pod fit.

`plan_moves` ranks candidate move sets cheaply (`candidates`) and checks each in the engine
itself, in order of fewest moves and then least compute moved: the set's pods are released
one by one, each placed again by the engine's own fit and scoring (`Engine.best` then
`Engine.assign`, what `Engine.place` does) among the other nodes, so every move truly moves,
and then the pending pod must be placed. The first set that passes is the plan. Every trial is
undone, on success, failure or exception alike, and the engine's random source is restored, so
the engine is left as it was found. A pending MIG pod's sets come from `mig` (holders of its
profile moved to free instances elsewhere; the MIG layouts never change). Pure: no I/O; the
caller decides what is movable (owner, opt-in, priority, cool-down) and carries the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.defrag.candidates import (
    MoveSet,
    Room,
    move_sets,
    pods_on,
    rank_nodes,
    single_gpu_container,
)
from elastic_gpu.core.defrag.mig import mig_move_sets, single_mig_container
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.placement import Engine, FreeCards
from elastic_gpu.core.request import ContainerRequest, PodRequest

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
    the node policy, else the pod's or the engine's); None when no plan is found. Plans a pod
    with one GPU container: a share, whole cards, or MIG instances of one profile (moved pods
    go to free instances of their own profile elsewhere, `defrag.mig`; several GPU
    containers: None). The
    engine is left as it was; `movable[key]` must be the request the pod was allocated with
    (`Engine.allocate(key, assignment, pod)`): undoing a trial allocates it again with it."""
    if max_moves <= 0 or engine.allocation(pending_key) is not None:
        return None
    mig = single_mig_container(pending)
    if mig is not None:
        names: Sequence[str] = engine.nodes()
        sets = mig_move_sets(engine, pending_key, pending, mig, movable, max_moves)
    else:
        container = single_gpu_container(pending)
        if container is None:
            return None
        free = engine.free_cards(pending)
        names = free.names
        sets = _card_move_sets(engine, free, pending_key, pending, container, movable,
                               max_moves)
    sets.sort(key=MoveSet.sort_key)
    if not sets:
        return None
    rng_state = engine.ctx.rng.bit_generator.state
    try:
        for candidate in sets[:MAX_TRIALS]:
            found = _trial(engine, candidate, pending_key, pending, movable, names, policy)
            if found is not None:
                return found
        return None
    finally:
        engine.ctx.rng.bit_generator.state = rng_state


def _card_move_sets(engine: Engine, free: FreeCards, pending_key: str, pending: PodRequest,
                    container: ContainerRequest, movable: Mapping[str, PodRequest],
                    max_moves: int) -> list[MoveSet]:
    """Move sets for a pending share or whole-card pod (`candidates`): the best nodes by the
    engine's arrays, then the movable pods on them."""
    check_host = engine.config.check_host_resources
    rows = rank_nodes(free, pending, container, max_moves, check_host)
    if not rows:
        return []
    placed = pods_on({free.names[r] for r in rows}, movable, engine.allocations(), pending_key)
    room = Room(free if pending.allowed_models is None and not pending.denied_models
                else engine.free_cards(PodRequest("")), check_host)
    sets: list[MoveSet] = []
    for order, row in enumerate(rows):
        name = free.names[row]
        if name not in placed:
            continue
        indices = [index for index, _, _ in engine.card_usage(name)]
        sets.extend(move_sets(free, row, order, pending, container, placed[name], movable,
                              indices, max_moves, check_host, room))
        if len(sets) >= 2 * MAX_TRIALS:
            break
    return sets


def _trial(engine: Engine, candidate: MoveSet, pending_key: str, pending: PodRequest,
           movable: Mapping[str, PodRequest], names: Sequence[str], policy: str | None
           ) -> DefragPlan | None:
    """Run one move set in the engine and undo it: the plan if the pending pod fits on the
    set's node once the set's pods are released, and then every one of them is placed again,
    on other cards (of that node or another), each where the engine's fit and scoring put it;
    and if the moves, carried out one by one from the state now, all fit."""
    node = candidate.node
    released: list[tuple[str, Assignment]] = []
    held: list[str] = []
    moves: list[Move] = []
    try:
        for key in candidate.keys:
            source = engine.release(key)
            if source is None:
                return None
            released.append((key, source))
        # the pending pod holds its cards first, so that no moved pod lands on them
        placement = engine.assign(pending, node)
        engine.allocate(pending_key, placement, pending)
        held.append(pending_key)
        for key, source in released:
            target = _place_elsewhere(engine, movable[key], source, names, node, policy)
            if target is None:
                return None
            engine.allocate(key, target, movable[key])
            held.append(key)
            moves.append(Move(key, source, target))
    except Unschedulable:
        return None
    finally:
        for key in reversed(held):
            engine.release(key)
        for key, source in reversed(released):
            engine.allocate(key, source, movable[key])
    ordered = _in_feasible_order(engine, moves, pending_key, pending, placement, movable)
    return DefragPlan(pending_key, placement, ordered) if ordered is not None else None


def _place_elsewhere(engine: Engine, pod: PodRequest, source: Assignment, names: Sequence[str],
                     home: str, policy: str | None) -> Assignment | None:
    """Where the engine places the pod now (`best`, then `assign`: what `place` does), unless
    that is the card set it came from: then the best among the nodes other than `home`; None
    if none."""
    node = engine.best(pod, names, policy)
    if node is None:
        return None
    target = engine.assign(pod, node)
    if not _same_cards(target, source):
        return target
    node = engine.best(pod, [n for n in names if n != home], policy)
    return engine.assign(pod, node) if node is not None else None


def _same_cards(a: Assignment, b: Assignment) -> bool:
    """Whether two assignments hold the same cards (MIG: the same instances)."""
    def held(x: Assignment) -> list[tuple[int, str]]:
        return sorted((s.index, s.mig_uuid or "") for s in x.shares())
    return a.node == b.node and held(a) == held(b)


def _in_feasible_order(engine: Engine, moves: Sequence[Move], pending_key: str,
                       pending: PodRequest, placement: Assignment,
                       movable: Mapping[str, PodRequest]) -> tuple[Move, ...] | None:
    """The moves in an order in which each fits when made, from the engine's state now, and the
    pending pod then fits (moves onto cards another move empties come after it); None if there
    is none. The engine is left as it was."""
    remaining = list(moves)
    done: list[Move] = []
    placed = False
    try:
        while remaining:
            for move in remaining:
                engine.release(move.pod_key)
                try:
                    engine.allocate(move.pod_key, move.target, movable[move.pod_key])
                except Unschedulable:
                    engine.allocate(move.pod_key, move.source, movable[move.pod_key])
                    continue
                done.append(move)
                remaining.remove(move)
                break
            else:
                return None
        try:
            engine.allocate(pending_key, placement, pending)
        except Unschedulable:
            return None
        placed = True
        return tuple(done)
    finally:
        if placed:
            engine.release(pending_key)
        for move in reversed(done):
            engine.release(move.pod_key)
            engine.allocate(move.pod_key, move.source, movable[move.pod_key])
