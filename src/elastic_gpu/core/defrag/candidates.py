"""Candidate move sets for a pending pod: cheap to rank, checked in the engine by `plan`.

Two stages. `rank_nodes` looks at every node at once through the engine's arrays
(`Engine.free_cards`) and keeps the nodes where the pending pod's shortfall is smallest: for N
whole cards, the fewest part-used cards to empty and the least compute on them; for a share,
the least compute missing on one card (on the N cards that lack least, for a share on N
cards). `move_sets` then looks at the movable pods on those nodes only and lists the sets whose
removal makes the pod fit there (cards emptied entirely, or enough freed on one card or on N,
and the node's CPU and memory), fewest pods first, then least compute moved (small shares are
the likeliest to fit elsewhere).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import numpy.typing as npt

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.placement import FreeCards
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind

#: nodes kept by the array ranking for the exact look at their pods
CANDIDATE_NODES = 64
#: cards of one node whose combinations are tried when several must be emptied
WHOLE_CARD_CHOICES = 6
#: movable pods of one card whose combinations are tried to free room for a share
SHARE_POD_CHOICES = 8
#: move sets kept per card (share) or per node (whole cards)
SETS_PER_PLACE = 3
_FAR = np.int64(1 << 40)


@dataclass(frozen=True)
class MoveSet:
    """Movable pods to move off `node` so that the pending pod fits there."""

    node: str
    #: in the order they are to be moved: the largest first, while the cluster has most room
    keys: tuple[str, ...]
    #: what they hold, the tie-break among sets of as many moves (least first): compute in
    #: milli-cards, or for MIG holders (`defrag.mig`) compute slices; the sets of one pending
    #: pod are all of one kind
    moved: int
    order: int  # the node's place in the ranking (ties)

    def sort_key(self) -> tuple[int, int, int, tuple[str, ...]]:
        return (len(self.keys), self.moved, self.order, self.keys)


def single_gpu_container(pod: PodRequest) -> ContainerRequest | None:
    """The pod's one share or whole-card container; None otherwise (no GPU, several GPU
    containers, MIG: `defrag.mig` plans a MIG pod)."""
    gpu = pod.gpu_containers
    if len(gpu) != 1 or gpu[0].kind not in (RequestKind.SHARE, RequestKind.WHOLE):
        return None
    return gpu[0]


def rank_nodes(free: FreeCards, pod: PodRequest, c: ContainerRequest, max_moves: int,
               check_host: bool) -> list[int]:
    """Rows worth an exact look, best first (at most CANDIDATE_NODES)."""
    usable = free.usable & (free.cap_memory >= c.memory_mib) & (free.cap_milli >= c.compute_milli)
    used = free.used_milli
    if c.kind is RequestKind.WHOLE:
        touched = usable & ((used > 0) | (free.used_memory > 0))
        untouched = (usable & ~touched).sum(axis=1)
        need = np.maximum(c.cards - untouched, 0)
        possible = usable.sum(axis=1) >= c.cards
        # compute on the `need` least-used part-used cards: what has to move
        ordered = np.sort(np.where(touched, used, _FAR), axis=1)
        sums = np.concatenate([np.zeros((len(free.names), 1), dtype=np.int64),
                               np.cumsum(ordered, axis=1)], axis=1)
        width = sums.shape[1] - 1
        proxy = sums[np.arange(len(free.names)), np.minimum(need, width)]
    else:
        lack_milli = np.where(usable, np.maximum(c.compute_milli - (free.cap_milli - used), 0), _FAR)
        lack_mem = np.where(usable, np.maximum(c.memory_mib - (free.cap_memory - free.used_memory),
                                               0), _FAR)
        lack = lack_milli + np.minimum(lack_mem, _FAR)
        if c.cards == 1:
            possible = usable.any(axis=1)
            proxy = lack.min(axis=1)
            need = (proxy > 0).astype(np.int64)
        else:  # a multi-card share: what is missing on the N cards that lack least
            possible = usable.sum(axis=1) >= c.cards
            least = np.sort(lack, axis=1)[:, :c.cards]
            proxy = np.minimum(least, _FAR).sum(axis=1)
            need = (least > 0).sum(axis=1).astype(np.int64)
    host_lack = np.zeros(len(free.names), dtype=np.int64)
    if check_host:
        cpu_short = np.maximum(pod.cpu_milli - (free.cpu_capacity - free.cpu_used), 0)
        mem_short = np.maximum(pod.memory_mib - (free.memory_capacity - free.memory_used), 0)
        possible &= (free.cpu_capacity >= pod.cpu_milli) & (free.memory_capacity >= pod.memory_mib)
        host_lack = cpu_short + mem_short
        need = np.maximum(need, (host_lack > 0).astype(np.int64))
    possible &= (need >= 1) & (need <= max_moves)
    rows = np.flatnonzero(possible)
    order = np.lexsort((rows, host_lack[rows], proxy[rows], need[rows]))
    return [int(r) for r in rows[order[:CANDIDATE_NODES]]]


def pods_on(nodes: set[str], movable: Mapping[str, PodRequest],
            allocations: Mapping[str, Assignment], skip: str
            ) -> dict[str, dict[str, Assignment]]:
    """node -> the movable pods placed there and what they hold (pods holding a MIG instance
    left out: moving them frees no compute)."""
    out: dict[str, dict[str, Assignment]] = defaultdict(dict)
    for key, a in allocations.items():
        if a.node not in nodes or key == skip or key not in movable:
            continue
        if any(s.mig_uuid is not None for s in a.shares()):
            continue
        out[a.node][key] = a
    return out


class Room:
    """Where a pod of a given shape could go now, from the arrays (models not looked at: an
    optimistic test that spares the engine trials of pods that fit nowhere)."""

    def __init__(self, free: FreeCards, check_host: bool) -> None:
        self.free_milli = np.where(free.usable, free.cap_milli - free.used_milli, -1)
        self.free_memory = np.where(free.usable, free.cap_memory - free.used_memory, -1)
        self.untouched = free.usable & (free.used_milli == 0) & (free.used_memory == 0)
        self.cap_memory = free.cap_memory
        self.cpu_free = free.cpu_capacity - free.cpu_used
        self.memory_free = free.memory_capacity - free.memory_used
        self.check_host = check_host
        self._rows: dict[tuple[object, ...], tuple[npt.NDArray[np.bool_], int]] = {}

    def rows_for(self, pod: PodRequest, c: ContainerRequest) -> tuple[npt.NDArray[np.bool_], int]:
        """Nodes where the pod fits now (cards, and CPU and memory when checked), and how
        many."""
        key = (c.kind, c.cards, c.compute_milli, c.memory_mib, pod.cpu_milli, pod.memory_mib)
        cached = self._rows.get(key)
        if cached is not None:
            return cached
        if c.kind is RequestKind.SHARE:
            fits = (self.free_milli >= c.compute_milli) & (self.free_memory >= c.memory_mib)
            gpu: npt.NDArray[np.bool_] = np.greater_equal(fits.sum(axis=1), c.cards)
        else:
            slots = (self.untouched & (self.cap_memory >= c.memory_mib)).sum(axis=1)
            gpu = np.greater_equal(slots, c.cards)
        if self.check_host:
            gpu = gpu & (self.cpu_free >= pod.cpu_milli) & (self.memory_free >= pod.memory_mib)
        self._rows[key] = out = (gpu, int(gpu.sum()))
        return out

    def may_move(self, pod: PodRequest, row: int, cols: set[int], may_stay: bool) -> bool:
        """Whether the pod, on `cols` of `row` now, fits on another node, or (`may_stay`: the
        pending pod does not need the CPU and memory it holds there) on another card of its
        own node."""
        c = single_gpu_container(pod)
        if c is None:
            return True
        rows, count = self.rows_for(pod, c)
        if count - int(rows[row]) > 0:
            return True
        if not may_stay:
            return False
        others = [col for col in range(self.free_milli.shape[1]) if col not in cols]
        if c.kind is RequestKind.SHARE:
            return sum(bool(self.free_milli[row, col] >= c.compute_milli
                            and self.free_memory[row, col] >= c.memory_mib)
                       for col in others) >= c.cards
        return sum(bool(self.untouched[row, col]) for col in others) >= c.cards


@dataclass
class _NodePods:
    """The movable pods of one node by card column, and what they hold."""

    keys: list[str]
    by_col: dict[int, list[str]]
    milli_on: dict[int, int]
    mem_on: dict[int, int]
    milli: dict[str, int]
    cols: dict[str, set[int]]

    @staticmethod
    def of(allocation: Mapping[str, Assignment], col_of: Mapping[int, int]) -> _NodePods:
        by_col: dict[int, list[str]] = defaultdict(list)
        milli_on: dict[int, int] = defaultdict(int)
        mem_on: dict[int, int] = defaultdict(int)
        milli: dict[str, int] = {}
        cols: dict[str, set[int]] = defaultdict(set)
        for key in allocation:
            total = 0
            for share in allocation[key].shares():
                col = col_of.get(share.index)
                if col is None:
                    continue
                if key not in by_col[col]:
                    by_col[col].append(key)
                cols[key].add(col)
                milli_on[col] += share.milli
                mem_on[col] += share.memory_mib
                total += share.milli
            milli[key] = total
        return _NodePods(list(allocation), by_col, milli_on, mem_on, milli, cols)


def move_sets(free: FreeCards, row: int, order: int, pod: PodRequest, c: ContainerRequest,
              allocation: Mapping[str, Assignment], movable: Mapping[str, PodRequest],
              card_indices: Sequence[int], max_moves: int, check_host: bool, room: Room
              ) -> list[MoveSet]:
    """Sets of this node's movable pods (`allocation`: what each holds) whose removal lets the
    pod fit on it; pods with nowhere to go (`room`) are left out."""
    col_of = {index: col for col, index in enumerate(card_indices)}
    held = _NodePods.of(allocation, col_of)
    may_stay = not check_host or (
        free.cpu_capacity[row] - free.cpu_used[row] >= pod.cpu_milli
        and free.memory_capacity[row] - free.memory_used[row] >= pod.memory_mib)
    stuck = {k for k in held.keys
             if not room.may_move(movable[k], row, held.cols[k], bool(may_stay))}
    name = free.names[row]
    cols = [col for col in range(len(card_indices)) if free.usable[row, col]
            and free.cap_memory[row, col] >= c.memory_mib
            and free.cap_milli[row, col] >= c.compute_milli]
    bases: list[tuple[str, ...]] = []
    if c.kind is RequestKind.WHOLE:
        empty = [col for col in cols
                 if free.used_milli[row, col] == 0 and free.used_memory[row, col] == 0]
        need = c.cards - len(empty)
        # a part-used card is freed only if everything on it is movable
        freeable = [col for col in cols if col not in empty and held.by_col.get(col)
                    and not stuck.intersection(held.by_col[col])
                    and held.milli_on[col] == free.used_milli[row, col]
                    and held.mem_on[col] == free.used_memory[row, col]]
        freeable.sort(key=lambda col: (len(held.by_col[col]), held.milli_on[col], col))
        if need <= 0:
            bases.append(())
        elif len(freeable) >= need:
            for chosen in combinations(freeable[:WHOLE_CARD_CHOICES], need):
                union = sorted({k for col in chosen for k in held.by_col[col]})
                if len(union) <= max_moves:
                    bases.append(tuple(union))
    elif c.cards > 1:
        bases.extend(_multi_share_bases(free, row, c, cols, held, allocation, col_of, stuck,
                                        max_moves))
    else:
        for col in cols:
            bases.extend(_card_sets(free, row, col, c, held, allocation, col_of, stuck,
                                    max_moves))
    out: dict[tuple[str, ...], MoveSet] = {}
    for base in bases:
        chosen_keys = _with_host_room(free, row, pod, base, held, movable, max_moves, check_host,
                                      stuck)
        if not chosen_keys:
            continue
        ordered = tuple(sorted(chosen_keys, key=lambda k: (-held.milli[k], k)))
        out.setdefault(tuple(sorted(ordered)), MoveSet(name, ordered, sum(held.milli[k] for k in ordered),
                                                       order))
    sets = sorted(out.values(), key=MoveSet.sort_key)
    return sets[:SETS_PER_PLACE] if c.kind is RequestKind.WHOLE else sets


def _card_sets(free: FreeCards, row: int, col: int, c: ContainerRequest, held: _NodePods,
               allocation: Mapping[str, Assignment], col_of: Mapping[int, int],
               stuck: set[str], max_moves: int) -> list[tuple[str, ...]]:
    """The fewest movable pods of one card whose moving frees a share's compute and memory
    there (least compute first, at most SETS_PER_PLACE); [()] when it has room already."""
    lack_milli = c.compute_milli - int(free.cap_milli[row, col] - free.used_milli[row, col])
    lack_mem = c.memory_mib - int(free.cap_memory[row, col] - free.used_memory[row, col])
    if lack_milli <= 0 and lack_mem <= 0:
        return [()]
    there = sorted((k for k in held.by_col.get(col, []) if k not in stuck),
                   key=lambda k: (held.milli[k], k))
    found: list[tuple[str, ...]] = []
    for size in range(1, min(max_moves, len(there)) + 1):
        for combo in combinations(there[:SHARE_POD_CHOICES], size):
            milli = sum(held.milli[k] for k in combo)
            mem = sum(s.memory_mib for k in combo for s in allocation[k].shares()
                      if col_of.get(s.index) == col)
            if milli >= lack_milli and mem >= lack_mem:
                found.append(combo)
        if found:
            break  # the fewest pods that free enough on this card
    found.sort(key=lambda combo: (sum(held.milli[k] for k in combo), combo))
    return found[:SETS_PER_PLACE]


def _multi_share_bases(free: FreeCards, row: int, c: ContainerRequest, cols: Sequence[int],
                       held: _NodePods, allocation: Mapping[str, Assignment],
                       col_of: Mapping[int, int], stuck: set[str], max_moves: int
                       ) -> list[tuple[str, ...]]:
    """Move sets for a multi-card share (N distinct cards with room): the cards with room
    already, and each choice of the cheapest others to free (each by its own cheapest set,
    `_card_sets`), the union of their pods; the engine checks each set (`plan`)."""
    cheapest: dict[int, tuple[str, ...]] = {}
    ready = 0
    for col in cols:
        sets = _card_sets(free, row, col, c, held, allocation, col_of, stuck, max_moves)
        if sets == [()]:
            ready += 1
        elif sets:
            cheapest[col] = sets[0]
    need = c.cards - ready
    if need <= 0:
        return [()]
    ranked = sorted(cheapest, key=lambda col: (len(cheapest[col]),
                                              sum(held.milli[k] for k in cheapest[col]), col))
    bases: list[tuple[str, ...]] = []
    for chosen in combinations(ranked[:WHOLE_CARD_CHOICES], need):
        union = tuple(sorted({k for col in chosen for k in cheapest[col]}))
        if len(union) <= max_moves:
            bases.append(union)
    return bases


def _with_host_room(free: FreeCards, row: int, pod: PodRequest, base: tuple[str, ...],
                    held: _NodePods, movable: Mapping[str, PodRequest], max_moves: int,
                    check_host: bool, stuck: set[str]) -> tuple[str, ...]:
    """`base` and, if the node's CPU or memory is still short, the movable pods there holding
    the most CPU until it is not; () when that takes more than max_moves (or nothing moves)."""
    keys = list(base)
    if check_host:
        cpu_free = int(free.cpu_capacity[row] - free.cpu_used[row])
        mem_free = int(free.memory_capacity[row] - free.memory_used[row])
        cpu_free += sum(movable[k].cpu_milli for k in keys)
        mem_free += sum(movable[k].memory_mib for k in keys)
        rest = sorted((k for k in held.keys if k not in keys and k not in stuck),
                      key=lambda k: (-movable[k].cpu_milli, -movable[k].memory_mib, k))
        for key in rest:
            if cpu_free >= pod.cpu_milli and mem_free >= pod.memory_mib:
                break
            keys.append(key)
            cpu_free += movable[key].cpu_milli
            mem_free += movable[key].memory_mib
        if cpu_free < pod.cpu_milli or mem_free < pod.memory_mib:
            return ()
    if not keys or len(keys) > max_moves:
        return ()
    return tuple(keys)
