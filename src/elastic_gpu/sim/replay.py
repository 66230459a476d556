"""One replay of a workload on a cluster, under the FGD paper's protocol.

1. The cluster is the GPU nodes. Each node gets a tie-break rank from the seed (the authors'
   simulator prefixes node names with a seeded random permutation and breaks score ties by the
   smallest name; a seeded rank per node is the same rule).
2. Tasks are sorted by name and shuffled by the seed.
3. Resampling ("tune"): while the total GPU request is below inflation x capacity, a task drawn
   uniformly with replacement from the original list is appended (named `<name>#<k>`); the first
   draw whose per-card share would cross the target stops it (the artifact's rule, which lets a
   final multi-GPU draw overshoot a little). Above the target, random tasks are dropped instead.
4. Tasks arrive one by one and never leave. After every arrival the cluster's allocated GPU,
   the arrived GPU request (failed tasks included) and the fragmentation are recorded.
5. Allocation at "arrived = x%" is the mean allocation over the arrivals whose arrived request,
   rounded to a whole percent of capacity, is x (or within x +- 1 when none is exactly x; on
   small clusters, where one task moves the arrived request by several percent, the state after
   the last arrival below x).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from elastic_gpu.core.defrag import DefragPlan, plan_moves
from elastic_gpu.core.frag import Fragmentation, sorted_free
from elastic_gpu.core.model import Node, cluster_cpu_per_gpu
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.policies import default_card_policy, node_policy
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.workload import TargetWorkload
from elastic_gpu.sim.trace import Task

REPORT_POINTS = (50, 90, 100, 130)


@dataclass(frozen=True)
class Placement:
    task: str
    node: str
    cards: tuple[tuple[int, int], ...]  # (card index, milli)


@dataclass
class ReplayResult:
    policy: str
    card_policy: str
    seed: int
    inflation: float
    gpu_capacity: int  # cards
    wall_seconds: float
    tasks: int
    arrived_milli: np.ndarray  # per arrival
    used_milli: np.ndarray
    frag_milli: np.ndarray
    idle_milli: np.ndarray
    #: failed tasks by their first failing check (`NoNodeFits.first_failing`), all arrivals
    failed: Counter[str] = field(default_factory=Counter)
    placements: list[Placement] = field(default_factory=list)
    #: the same, over the arrivals up to 100% arrived (arrived request, rounded to a whole
    #: percent of capacity as the measures bin it, at most 100)
    failed_to_100: Counter[str] = field(default_factory=Counter)
    #: the move budget per task that failed to place (`--defrag-moves`; 0: no defragmentation)
    defrag_moves: int = 0
    #: placed tasks moved by defragmentation plans, over all arrivals and up to 100% arrived
    moves: int = 0
    moves_to_100: int = 0
    #: tasks placed thanks to a plan (over all arrivals, up to 100% arrived)
    rescued: int = 0
    rescued_to_100: int = 0

    def curve(self, values: np.ndarray) -> dict[int, float]:
        """values per arrival -> mean per arrived percent (0..max), the artifact's binning."""
        cap = self.gpu_capacity * 1000
        arrived = np.array([round(x) for x in (self.arrived_milli / cap * 100).tolist()])
        out: dict[int, float] = {}
        top = int(arrived.max()) if arrived.size else 0
        for x in range(top + 1):
            sel = values[arrived == x]
            if sel.size == 0:
                sel = values[(arrived >= x - 1) & (arrived <= x + 1)]
            if sel.size == 0:
                # Small clusters jump several percent per task: the state at that level is the
                # one after the last arrival below it (allocation is a step function).
                below = np.flatnonzero(arrived < x)
                if below.size == 0:
                    continue
                sel = values[below[-1:]]
            out[x] = float(np.mean(sel))
        return out

    def allocation_curve(self) -> dict[int, float]:
        cap = self.gpu_capacity * 1000
        alloc = np.array([round(v, 2) for v in (self.used_milli / cap * 100).tolist()])
        return {k: round(v, 2) for k, v in self.curve(alloc).items()}

    def frag_rate_curve(self) -> dict[int, float]:
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(self.idle_milli > 0, 100 * self.frag_milli / self.idle_milli, 0.0)
        return {k: round(v, 2) for k, v in self.curve(rate).items()}

    def frag_amount_curve(self) -> dict[int, float]:
        cap = self.gpu_capacity * 1000
        return {k: round(v, 2) for k, v in self.curve(100 * self.frag_milli / cap).items()}

    def defrag_summary(self) -> dict[str, object]:
        """The defragmentation figures (only in a replay with a move budget)."""
        return {"defrag_moves": self.defrag_moves, "moves": self.moves,
                "moves_to_100": self.moves_to_100, "rescued": self.rescued,
                "rescued_to_100": self.rescued_to_100,
                "moves_pct_of_tasks": round(100 * self.moves / self.tasks, 3) if self.tasks else 0.0}

    def summary(self) -> dict[str, object]:
        alloc = self.allocation_curve()
        rate = self.frag_rate_curve()
        amount = self.frag_amount_curve()
        # A replay resampled to 1.3x may end a point or two short of 130% (the resampling stops
        # at the first draw that would cross it): report the final state there.
        for curve in (alloc, rate, amount):
            if curve:
                last = max(curve)
                for p in REPORT_POINTS:
                    if p > last:
                        curve[p] = curve[last]
        pick = [p for p in REPORT_POINTS if p in alloc]
        out: dict[str, object] = {
            "policy": self.policy,
            "card_policy": self.card_policy,
            "seed": self.seed,
            "inflation": self.inflation,
            "wall_seconds": round(self.wall_seconds, 3),
            "tasks": self.tasks,
            "gpu_capacity": self.gpu_capacity,
            "allocation": {str(p): alloc[p] for p in pick},
            "unallocated": {str(p): round(p - alloc[p], 2) for p in pick},
            "fragmentation_rate": {str(p): rate[p] for p in pick if p in rate},
            "fragmentation_amount": {str(p): amount[p] for p in pick if p in amount},
            "failed": dict(sorted(self.failed.items())),
            "failed_to_100": dict(sorted(self.failed_to_100.items())),
            "placed": len(self.placements),
        }
        if self.defrag_moves > 0:  # a replay without defragmentation reads as it always did
            out["defrag"] = self.defrag_summary()
        return out


def failed_check(err: Unschedulable) -> str:
    """What a failed task is counted as: its first failing check over the cluster
    (`NoNodeFits.first_failing`: cpu, memory, model, gpu, mig, ...)."""
    return err.summary.first_failing if err.summary is not None else err.category


def arrival_order(tasks: Sequence[Task], gpu_capacity_milli: int, inflation: float,
                  seed: int) -> list[Task]:
    """Shuffle by seed, then resample (or drop) to inflation x capacity; see module docstring."""
    rng = np.random.default_rng(seed)
    base = sorted(tasks, key=lambda t: t.name)
    order = [base[i] for i in rng.permutation(len(base))]
    target = inflation * gpu_capacity_milli
    total = sum(t.total_milli for t in order)
    if inflation <= 0 or total == target:
        return order
    if total > target:
        while total > target and order:
            removed = order.pop(int(rng.integers(len(order))))
            total -= removed.total_milli
        return order
    if not any(t.total_milli for t in base):
        return order  # no GPU request to resample towards the target
    k = 0
    while True:
        pick = base[int(rng.integers(len(base)))]
        if total + pick.gpu_milli > target:
            break
        order.append(pick.renamed(f"{pick.name}#{k}"))
        total += pick.total_milli
        k += 1
    return order


def target_workload(tasks: Sequence[Task], policy: str, popularity: float | None = None,
                    nodes: Sequence[Node] = ()) -> TargetWorkload:
    """The target workload a policy scores a trace against on `nodes`: FGD's typical pods
    covering `popularity` of the tasks, by default the share the node policy asks for this
    workload on these nodes (`NodePolicy.popularity_for`: FGD's 0.95, all of them for
    fgdx-mem; fgdx-auto's depends on the workload's CPU-only share and, under CPU pressure,
    on its share mix)."""
    tally = Counter(t.shape() for t in tasks)
    if popularity is None:
        popularity = node_policy(policy).popularity_for(tally, cluster_cpu_per_gpu(nodes))
    return TargetWorkload.from_counts(tally, popularity)


def replay(nodes: Sequence[Node], tasks: Sequence[Task], policy: str, seed: int = 42,
           inflation: float = 1.3, card_policy: str = "auto", workload: TargetWorkload | None = None,
           keep_placements: bool = False,
           progress: Callable[[int, int], None] | None = None,
           popularity: float | None = None, defrag_moves: int = 0,
           defrag_cpu_tasks: bool = False) -> ReplayResult:
    """Replay `tasks` on `nodes` with a node policy; see the module docstring for the protocol.

    `defrag_moves` > 0: a GPU task that fails to place asks the defragmentation planner
    (`core.defrag.plan_moves`) for at most that many moves of placed GPU tasks (a trace has no
    owners: every placed GPU task is movable, any number of times); a plan found is carried out
    (the moved tasks re-placed where it says, counted in `moves`) and the task placed.
    `defrag_cpu_tasks`: CPU-only tasks are movable too (they hold CPU on GPU nodes)."""
    if defrag_moves < 0:
        raise ValueError(f"the move budget must be 0 or more, got {defrag_moves}")
    started = time.perf_counter()
    gpu_nodes = [n for n in nodes if n.cards]
    capacity = sum(len(n.cards) for n in gpu_nodes)
    if capacity == 0:
        raise ValueError("the cluster has no GPUs")
    # "auto": the card tier the node policy is paired with, the extender's default too
    cards = default_card_policy(policy) if card_policy == "auto" else card_policy
    # The policy scores against its own target workload (`NodePolicy.popularity`); the reported
    # fragmentation is the paper's, against FGD's typical pods, so policies compare on one measure.
    measured = workload or TargetWorkload.from_tasks(t.shape() for t in tasks)
    if workload is None:
        workload = target_workload(tasks, policy, popularity, gpu_nodes)
    engine = Engine(gpu_nodes, PolicyConfig(node_policy=policy, card_policy=cards), seed=seed,
                    workload=workload)
    arrivals = arrival_order(tasks, capacity * 1000, inflation, seed)
    n = len(arrivals)
    arrived = np.zeros(n, dtype=np.float64)
    used = np.zeros(n, dtype=np.float64)
    frag = np.zeros(n, dtype=np.float64)
    idle = np.zeros(n, dtype=np.float64)
    frag_model = engine.ctx.frag if measured == workload else Fragmentation(measured)
    node_frag: dict[str, float] = {}
    for node in gpu_nodes:
        view = engine.node_view(node.name)
        node_frag[node.name] = frag_model.node(view.model, view.cpu_free, sorted_free(view.free))
    frag_total = sum(node_frag.values())
    arrived_total = 0
    used_total = 0
    failed: Counter[str] = Counter()
    failed_to_100: Counter[str] = Counter()
    placements: list[Placement] = []
    movable: dict[str, PodRequest] = {}
    tally = Counter[str]()
    # Requests the planner found no plan for since the last plan carried out, per GPU shape
    # (compute per card, cards, models): (CPU, memory) of each. Tasks only arrive, so the
    # cluster only fills, and a task asking at least as much as one without a plan would not
    # get one either: true of an exhaustive search; the planner's is bounded, so this is the
    # simulator's shortcut (it spares thousands of calls past 100% arrived), stated in
    # docs/simulator.md.
    hopeless: dict[tuple[int, int, frozenset[str]], list[tuple[int, int]]] = {}
    slot: dict[str, int] = {}  # task key -> its entry in `placements`

    def refrag(node: str) -> float:
        view = engine.node_view(node)
        value = frag_model.node(view.model, view.cpu_free, sorted_free(view.free))
        change = value - node_frag[node]
        node_frag[node] = value
        return change

    for i, task in enumerate(arrivals):
        arrived_total += task.total_milli
        pod = task.request()
        to_100 = round(arrived_total / (capacity * 1000) * 100) <= 100
        try:
            try:
                assignment = engine.place(pod)
            except Unschedulable:
                shape = task.shape()
                gpu_shape = (shape.gpu_milli, shape.gpu_count, shape.models)
                beaten = any(cpu <= shape.cpu_milli and mem <= shape.memory_mib
                             for cpu, mem in hopeless.get(gpu_shape, ()))
                plan = (plan_moves(engine, pod.key, pod, movable, defrag_moves)
                        if defrag_moves > 0 and pod.wants_gpu and not beaten else None)
                if plan is None:
                    if defrag_moves > 0 and not beaten:
                        hopeless.setdefault(gpu_shape, []).append((shape.cpu_milli,
                                                                   shape.memory_mib))
                    raise
                hopeless.clear()
                for moved in carry_out(engine, plan, movable, tally, to_100):
                    frag_total += refrag(moved)
                for move in plan.moves:  # the placements say where each task ended
                    old = placements[slot[move.pod_key]]
                    placements[slot[move.pod_key]] = Placement(
                        old.task, move.target.node,
                        tuple((c.index, c.milli) for c in move.target.shares()) if keep_placements
                        else ())
                assignment = plan.placement
            engine.allocate(pod.key, assignment, pod)
        except Unschedulable as err:
            check = failed_check(err)
            failed[check] += 1
            if to_100:
                failed_to_100[check] += 1
        else:
            if defrag_moves > 0 and (pod.wants_gpu or defrag_cpu_tasks):
                movable[pod.key] = pod
            shares = tuple((s.index, s.milli) for s in assignment.shares())
            used_total += sum(m for _, m in shares)
            frag_total += refrag(assignment.node)
            if defrag_moves > 0:
                slot[pod.key] = len(placements)
            if keep_placements:
                placements.append(Placement(task.name, assignment.node, shares))
            else:
                placements.append(Placement(task.name, assignment.node, ()))
        arrived[i] = arrived_total
        used[i] = used_total
        frag[i] = frag_total
        idle[i] = capacity * 1000 - used_total
        if progress is not None and (i % 256 == 0 or i == n - 1):
            progress(i + 1, n)
    return ReplayResult(policy, cards, seed, inflation, capacity, time.perf_counter() - started, n,
                        arrived, used, frag, idle, failed, placements, failed_to_100,
                        defrag_moves, tally["moves"], tally["moves_to_100"], tally["rescued"],
                        tally["rescued_to_100"])


def carry_out(engine: Engine, plan: DefragPlan, movable: dict[str, PodRequest],
              tally: Counter[str], to_100: bool) -> list[str]:
    """Move the plan's pods where it says (the pending pod is the caller's to allocate), count
    the moves and the rescue; the nodes whose usage changed."""
    touched: list[str] = []
    for move in plan.moves:
        engine.release(move.pod_key)
        engine.allocate(move.pod_key, move.target, movable[move.pod_key])
        touched += [move.source.node, move.target.node]
    tally["moves"] += len(plan.moves)
    tally["rescued"] += 1
    if to_100:
        tally["moves_to_100"] += len(plan.moves)
        tally["rescued_to_100"] += 1
    return list(dict.fromkeys(touched))
