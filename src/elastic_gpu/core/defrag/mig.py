"""Candidate move sets for a pending MIG pod: which pods to move off existing MIG instances.

A pod asking N instances of a profile needs them on one node. The cluster may have N free
instances of it in all, spread over nodes, or the one node a pod must use (its model, its CPU)
may have its instances held by pods that could run on another node's free instance. Moving
such a holder to a free instance of its own profile elsewhere frees its instance here: the
MIG layouts themselves never change (no re-carving).

`mig_move_sets` lists, per node, the fewest holders of the pending pod's profile whose moves
leave N instances free there; a holder is a candidate only if its MIG request fits on free
instances of another node now (an optimistic test from the instance counts: `plan` checks each
set in the engine). Instances of one profile on one node are interchangeable to a pod, so a
move within a node frees nothing and is never proposed. Pure, no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.defrag.candidates import SETS_PER_PLACE, SHARE_POD_CHOICES, MoveSet
from elastic_gpu.core.model import Health, Node
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile


def single_mig_container(pod: PodRequest) -> ContainerRequest | None:
    """The pod's one GPU container when it asks MIG instances (one profile, N of it)."""
    gpu = pod.gpu_containers
    if len(gpu) != 1 or gpu[0].kind is not RequestKind.MIG or gpu[0].mig_profile is None:
        return None
    return gpu[0]


def mig_needs(pod: PodRequest) -> Counter[MigProfile] | None:
    """Instances per profile the pod asks, when all its GPU containers ask MIG; None
    otherwise (a pod that also asks shares or whole cards is not moved for MIG room)."""
    need: Counter[MigProfile] = Counter()
    for c in pod.gpu_containers:
        if c.kind is not RequestKind.MIG or c.mig_profile is None:
            return None
        need[c.mig_profile] += c.cards
    return need if need else None


@dataclass(frozen=True)
class _NodeInstances:
    """One node's healthy MIG instances: free ones per profile, and the instances of the
    pending pod's profile (on cards of a model it accepts) each pod holds."""

    free: Counter[MigProfile]
    wanted_free: int  # free instances of the pending pod's profile it may use
    wanted_held: dict[str, int]  # pod key -> instances of that profile it holds here


def _instances(node: Node, owner: Mapping[str, str], pending: PodRequest,
               profile: MigProfile) -> _NodeInstances:
    free: Counter[MigProfile] = Counter()
    wanted_free = 0
    wanted_held: dict[str, int] = defaultdict(int)
    for card in node.cards:
        if not card.healthy:
            continue
        usable = pending.accepts_model(card.model)
        for inst in card.mig:
            if inst.health is not Health.HEALTHY:
                continue
            holder = owner.get(inst.uuid)
            if holder is None:
                free[inst.profile] += 1
            if not usable or inst.profile != profile:
                continue
            if holder is None:
                wanted_free += 1
            else:
                wanted_held[holder] += 1
    return _NodeInstances(free, wanted_free, dict(wanted_held))


class _FreeElsewhere:
    """Whether a pod's MIG request fits on free instances of a node other than its own: for
    one profile (the common case) from the two nodes with the most free instances of it, so a
    large cluster is not scanned per holder; for several, by a scan."""

    def __init__(self, by_node: Mapping[str, _NodeInstances]) -> None:
        self.by_node = by_node
        self._top: dict[MigProfile, list[tuple[int, str]]] = {}

    def fits(self, need: Counter[MigProfile], home: str) -> bool:
        if len(need) == 1:
            ((profile, count),) = need.items()
            return any(free >= count and name != home for free, name in self._best(profile))
        return any(name != home and all(there.free[p] >= n for p, n in need.items())
                   for name, there in self.by_node.items())

    def _best(self, profile: MigProfile) -> list[tuple[int, str]]:
        top = self._top.get(profile)
        if top is None:
            ranked = sorted(((there.free[profile], name) for name, there in self.by_node.items()
                             if there.free[profile] > 0), key=lambda t: -t[0])
            self._top[profile] = top = ranked[:2]
        return top


def mig_move_sets(engine: Engine, pending_key: str, pending: PodRequest, c: ContainerRequest,
                  movable: Mapping[str, PodRequest], max_moves: int) -> list[MoveSet]:
    """Sets of movable pods, each on one node, whose moves leave `c.cards` instances of
    `c.mig_profile` free there: fewest pods first, then the fewest compute slices moved.
    With host checks on, the node must also have the pending pod's CPU and memory once the
    set's pods are gone (a MIG plan moves only holders of the profile)."""
    assert c.mig_profile is not None
    profile = c.mig_profile
    allocations = engine.allocations()
    owner = {s.mig_uuid: key for key, a in allocations.items() for s in a.shares()
             if s.mig_uuid is not None}
    names = engine.nodes()
    nodes = [engine.node(name) for name in names]
    by_node = {n.name: _instances(n, owner, pending, profile) for n in nodes}
    # slices per instance from the inventory (an assignment's profile text is not trusted)
    slices = {inst.uuid: inst.profile.slices for n in nodes for card in n.cards
              for inst in card.mig}
    check_host = engine.config.check_host_resources
    elsewhere = _FreeElsewhere(by_node)
    sets: list[MoveSet] = []
    for order, name in enumerate(names):
        here = by_node[name]
        need = c.cards - here.wanted_free
        if need <= 0 or need > sum(here.wanted_held.values()):
            continue
        holders = []
        for key, count in here.wanted_held.items():
            pod = movable.get(key)
            held = mig_needs(pod) if pod is not None and key != pending_key else None
            if held is not None and elsewhere.fits(held, name):
                holders.append((key, count, _slices(allocations[key], slices)))
        # the pods holding the most instances first: the fewest moves free the most
        holders.sort(key=lambda h: (-h[1], h[2], h[0]))
        found: list[tuple[str, ...]] = []
        for size in range(1, min(max_moves, len(holders)) + 1):
            for combo in combinations(holders[:SHARE_POD_CHOICES], size):
                if sum(count for _, count, _ in combo) >= need:
                    found.append(tuple(key for key, _, _ in combo))
            if found:
                break  # the fewest pods that free enough on this node
        if check_host:
            found = [keys for keys in found if _host_room(engine, name, pending, keys, movable)]
        node_sets = [MoveSet(name, keys, sum(_slices(allocations[k], slices) for k in keys),
                             order) for keys in found]
        node_sets.sort(key=MoveSet.sort_key)
        sets.extend(node_sets[:SETS_PER_PLACE])
    return sets


def _slices(assignment: Assignment, slices: Mapping[str, int]) -> int:
    """Compute slices of the MIG instances an assignment holds."""
    return sum(slices.get(s.mig_uuid, 0) for s in assignment.shares() if s.mig_uuid is not None)


def _host_room(engine: Engine, name: str, pending: PodRequest, keys: tuple[str, ...],
               movable: Mapping[str, PodRequest]) -> bool:
    node = engine.node(name)
    cpu_used, memory_used = engine.host_usage(name)
    cpu_free = node.cpu_milli - cpu_used + sum(movable[k].cpu_milli for k in keys)
    memory_free = node.memory_mib - memory_used + sum(movable[k].memory_mib for k in keys)
    return cpu_free >= pending.cpu_milli and memory_free >= pending.memory_mib
