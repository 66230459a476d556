"""The placement engine: fit, two-tier policy choice, and the allocation ledger. Pure, no I/O.

This is the front the simulator and the scheduler extender drive; the work is done by the
modules beside it (docs/architecture.md, "Placement inside the core"): `layout` keeps nodes and
cards as arrays, `ledger` what each pod holds, `fitmask` and `explain` which nodes fit and why
not, `planning` which cards a pod gets on a node, `scoring` the node policies through their seam.

Usage is a function of the allocation ledger: whenever the set of nodes or cards changes, the
arrays are rebuilt and every allocation replayed onto them, so `upsert_node` keeps allocations on
cards that still exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitFailure, FitKind, Unschedulable
from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.mig.pick import on_partly_held
from elastic_gpu.core.model import Node, cluster_cpu_per_gpu
from elastic_gpu.core.placement import explain, fitmask, ledger
from elastic_gpu.core.placement.cardtable import CardTable
from elastic_gpu.core.placement.explain import UNDETAILED
from elastic_gpu.core.placement.layout import UNKNOWN_NODE, BoolArray, FloatArray, IntArray, Layout
from elastic_gpu.core.placement.planning import plan
from elastic_gpu.core.placement.scoring import Scorer
from elastic_gpu.core.placement.task import task_shape
from elastic_gpu.core.policies import CardPolicy, NodeView, ScoreContext, default_card_policy
from elastic_gpu.core.policies import card_policy as make_card_policy
from elastic_gpu.core.policies import node_policy as make_node_policy
from elastic_gpu.core.request import PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.core.workload import TargetWorkload


@dataclass(frozen=True)
class PolicyConfig:
    node_policy: str = "binpack"
    #: None: the card tier the node policy is paired with (`policies.default_card_policy`)
    card_policy: str | None = None
    #: CPU/memory of the node: the simulator checks them; the extender leaves that to
    #: kube-scheduler, which checks them itself.
    check_host_resources: bool = True
    #: Among nodes that score equally, and cards a card policy rates equally, prefer the ones
    #: with lower observed utilisation (`Card.usage`; then less memory in use): new shares
    #: move off hot cards. Off: ties go to the seeded rank and the card index, as always.
    load_aware: bool = False


@dataclass(frozen=True)
class FilterResult:
    feasible: list[str]
    #: node -> why it cannot host the pod (`fit.describe` makes the sentence, at the edge)
    failed: dict[str, FitFailure]


@dataclass(frozen=True)
class ScoredNodes:
    """The named nodes split by fit, in the order asked, with the feasible ones' scores."""

    feasible: list[str]
    #: node-policy scores aligned with `feasible` (higher is better)
    scores: FloatArray
    #: the other names (unknown nodes included)
    failed: list[str]

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.feasible, self.scores.tolist(), strict=True))


@dataclass(frozen=True)
class FreeCards:
    """Capacity and use as arrays for a planner that ranks every node at once (core/defrag):
    row i is `names[i]` (the order of `Engine.nodes()`), column c the node's c-th card by index
    (the order of `Engine.card_usage`); padding cells are not `usable`."""

    names: list[str]
    #: the cards the pod may use: healthy, not MIG-enabled, its model, serving its resources
    usable: BoolArray
    cap_milli: IntArray
    used_milli: IntArray
    cap_memory: IntArray
    used_memory: IntArray
    #: per row: CPU (milli) and memory (MiB) capacity and use
    cpu_capacity: IntArray
    cpu_used: IntArray
    memory_capacity: IntArray
    memory_used: IntArray


class Engine:
    """Nodes, allocations, and placement decisions over them."""

    def __init__(self, nodes: Iterable[Node] = (), config: PolicyConfig = PolicyConfig(),
                 seed: int = 0, workload: TargetWorkload | None = None) -> None:
        self.config = config
        root = np.random.default_rng(seed)
        self._rank_rng = np.random.default_rng(root.integers(2**63))
        self._scorer = Scorer(ScoreContext(Fragmentation(workload or TargetWorkload.default()),
                                           np.random.default_rng(root.integers(2**63))))
        make_node_policy(config.node_policy)  # fail early on a bad name
        make_card_policy(config.card_policy or default_card_policy(config.node_policy))
        self._layout = Layout()
        self._ledger: dict[str, ledger.Entry] = {}
        self._fit_masks = fitmask.FitMasks()
        for node in nodes:
            self.upsert_node(node)

    @property
    def ctx(self) -> ScoreContext:
        """What policies share (`policies.ScoreContext`): the fragmentation model of the target
        workload, the seeded random source, the cluster's CPU per milli-card."""
        return self._scorer.ctx

    def set_workload(self, workload: TargetWorkload) -> None:
        """Score against another target workload from now on (the extender's observed one)."""
        self._scorer.ctx = ScoreContext(Fragmentation(workload), self.ctx.rng,
                                        self.ctx.cluster_cpu_per_gpu)
        self._scorer.clear()
        self._layout.touch_all()

    @property
    def cluster_cpu_per_gpu(self) -> float | None:
        """The CPU (milli) per milli-card of the current nodes (`model.cluster_cpu_per_gpu`):
        what a target workload's CPU pressure is measured against."""
        self._refresh()
        return self.ctx.cluster_cpu_per_gpu

    # ------------------------------------------------------------------ inventory

    def upsert_node(self, node: Node) -> None:
        known = node.name in self._layout.row_of
        self._layout.upsert(node, None if known else float(self._rank_rng.random()))

    def remove_node(self, name: str) -> None:
        self._layout.remove(name)

    def nodes(self) -> list[str]:
        return [r.node.name for r in self._layout.rows]

    def node(self, name: str) -> Node:
        return self._layout.rows[self._layout.row(name)].node

    # ------------------------------------------------------------------ decisions

    def filter(self, pod: PodRequest, node_names: Sequence[str] | None = None) -> FilterResult:
        self._refresh()
        names = list(node_names) if node_names is not None else self.nodes()
        rows = self.rows_of(names)
        fits = self._fits(pod, rows).tolist()
        feasible: list[str] = []
        failed: dict[str, FitFailure] = {}
        unfit: list[tuple[str, int]] = []
        for name, row, fit in zip(names, rows.tolist(), fits, strict=True):
            if row < 0:
                failed[name] = UNKNOWN_NODE
            elif fit:
                feasible.append(name)
            else:
                failed[name] = UNDETAILED  # explained below, in one pass (keeps the order)
                unfit.append((name, row))
        why = explain.why_not_rows(self._layout, self.ctx, self.config.check_host_resources,
                                   self._card_policy("binpack"), [row for _, row in unfit], pod)
        for (name, _), failure in zip(unfit, why, strict=True):
            failed[name] = failure or UNDETAILED
        return FilterResult(feasible, failed)

    def score(self, pod: PodRequest, node_names: Sequence[str], policy: str | None = None
              ) -> dict[str, float]:
        """Scores (higher is better) of the named nodes that can host the pod; nodes that are
        unknown or cannot host it are left out."""
        return self.scored(pod, node_names, policy).as_dict()

    def scored(self, pod: PodRequest, node_names: Sequence[str], policy: str | None = None
               ) -> ScoredNodes:
        """`score` and `filter`'s split without explanations, as arrays: one vectorised pass
        over the names (the extender sends up to every node of the cluster per request)."""
        self._refresh()
        name = policy or pod.node_policy or self.config.node_policy
        rows = self.rows_of(node_names)
        fit = self._fits(pod, rows)
        names = np.array(node_names, dtype=object)
        scores = self._scorer.scores(self._layout, self._scorer.node_policy(name), task_shape(pod), rows[fit])
        return ScoredNodes(names[fit].tolist(), self._mig_first(pod, rows[fit], scores),
                           names[~fit].tolist())

    def rows_of(self, node_names: Sequence[str]) -> IntArray:
        """Row of each named node, -1 for unknown names (dict lookups at C speed)."""
        return self._layout.rows_of(node_names)

    def best(self, pod: PodRequest, node_names: Sequence[str], policy: str | None = None
             ) -> str | None:
        """The node `place` would choose among the named ones (highest score, the seeded rank
        breaking ties), or None when none of them fits."""
        self._refresh()
        rows = self.rows_of(node_names)
        rows = rows[self._fits(pod, rows)]
        if rows.size == 0:
            return None
        return self._layout.rows[self._best_row(pod, rows, policy)].node.name

    def _best_row(self, pod: PodRequest, rows: IntArray, policy: str | None) -> int:
        chosen = self._scorer.node_policy(policy or pod.node_policy or self.config.node_policy)
        scores = self._mig_first(pod, rows, self._scorer.scores(self._layout, chosen,
                                                                task_shape(pod), rows))
        tied = rows[scores == scores.max()]
        if tied.size > 1 and self.config.load_aware:
            load = np.array([self._layout.node_load(int(r)) for r in tied])
            tied = tied[load == load.min()]
        return int(tied[np.argmin(self._layout.rank[tied])]) if tied.size > 1 else int(tied[0])

    def assign(self, pod: PodRequest, node_name: str, card_policy: str | None = None) -> Assignment:
        self._refresh()
        row = self._layout.row(node_name)
        if not fitmask.host_fits(self._layout, row, pod, self.config.check_host_resources):
            raise Unschedulable(self._why_not(row, pod) or UNDETAILED, node_name)
        chosen = self._card_policy(card_policy or self.card_policy_for(pod))
        planned = self._plan(row, pod, chosen)
        if isinstance(planned, FitFailure) and chosen.name != "binpack":
            # Fit is defined by the tightest-first plan; a card policy's greedy choice for one
            # container must not make a later container of the same pod fail where that fits.
            planned = self._plan(row, pod, self._card_policy("binpack"))
        if isinstance(planned, FitFailure):
            # a node-level check (health, models) says it better than the first short container
            why = self._why_not(row, pod)
            node_level = why is not None and why.kind in (FitKind.NO_HEALTHY_GPU,
                                                           FitKind.MODEL_NOT_ACCEPTED,
                                                           FitKind.CARD_NOT_PINNED)
            raise Unschedulable(why if why is not None and node_level else planned, node_name)
        return Assignment(node_name, planned)

    def card_policy_for(self, pod: PodRequest) -> str:
        """The card tier a pod's cards are chosen by: the pod's annotation, else the configured
        one, else the one its node policy is paired with (`policies.default_card_policy`, the
        pairing `egpu simulate` measures)."""
        return (pod.card_policy or self.config.card_policy
                or default_card_policy(pod.node_policy or self.config.node_policy))

    def place(self, pod: PodRequest) -> Assignment:
        self._refresh()
        if not self._layout.rows:
            raise Unschedulable(FitFailure(FitKind.NO_NODES))
        mask = self._fit_mask(pod)
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            raise explain.unschedulable(self._layout, self.ctx, self.config.check_host_resources,
                                        self._card_policy("binpack"), pod)
        row = self._best_row(pod, rows, None)
        return self.assign(pod, self._layout.rows[row].node.name)

    # ------------------------------------------------------------------ ledger

    def allocate(self, pod_key: str, assignment: Assignment, pod: PodRequest | None = None) -> None:
        """Record an assignment. With `pod` given (and host checks on) its CPU and memory are
        held on the node too. Raises Unschedulable if anything would exceed a capacity; the same
        key and assignment again is a no-op; a different assignment replaces the old one."""
        self._refresh()
        cpu = pod.cpu_milli if pod is not None and self.config.check_host_resources else 0
        mem = pod.memory_mib if pod is not None and self.config.check_host_resources else 0
        entry = ledger.Entry(assignment, cpu, mem, ledger.assignment_tag(assignment))
        old = self._ledger.get(pod_key)
        if old is not None:
            if old == entry:
                return
            self.release(pod_key)
        try:
            ledger.check(self._layout, pod_key, entry)
        except Unschedulable:
            if old is not None:
                self._apply(pod_key, old, +1)
                self._ledger[pod_key] = old
            raise
        self._apply(pod_key, entry, +1)
        self._ledger[pod_key] = entry

    def holdable_part(self, pod_key: str, assignment: Assignment) -> Assignment | None:
        """What of `assignment` `pod_key` could hold now (`ledger.holdable`); allocating it
        then succeeds unless the key holds something else meanwhile."""
        self._refresh()
        return ledger.holdable(self._layout, pod_key, assignment)

    def release(self, pod_key: str) -> Assignment | None:
        self._refresh()
        entry = self._ledger.pop(pod_key, None)
        if entry is None:
            return None
        self._apply(pod_key, entry, -1)
        return entry.assignment

    def rekey(self, old_key: str, new_key: str) -> Assignment:
        """Move the allocation held under `old_key` to `new_key`: the state after is the state
        after `release(old_key)` then `allocate(new_key, ...)` of the same entry, without
        taking the usage off the arrays and putting it back (a bind's reservation becoming the
        bound pod's hold). Nothing a decision reads changes, so no cached score is dropped.
        Raises KeyError for an unknown `old_key`, ValueError when `new_key` holds one."""
        entry = self._ledger.get(old_key)
        if entry is None:
            raise KeyError(old_key)
        if new_key in self._ledger:
            raise ValueError(f"{new_key} already holds an allocation")
        del self._ledger[old_key]
        self._ledger[new_key] = entry  # last, where allocate would have put it
        ledger.rekey(self._layout, old_key, new_key, entry)
        return entry.assignment

    def allocation(self, pod_key: str) -> Assignment | None:
        entry = self._ledger.get(pod_key)
        return entry.assignment if entry else None

    def allocations(self) -> Mapping[str, Assignment]:
        return {k: v.assignment for k, v in self._ledger.items()}

    def card_table(self) -> CardTable:
        """What is allocated on every card now, read node by node later (`cardtable`)."""
        self._refresh()
        return CardTable(self._layout)

    def card_usage(self, node_name: str) -> list[tuple[int, int, int]]:
        self._refresh()
        row = self._layout.row(node_name)
        r = self._layout.rows[row]
        return [(card.index, int(self._layout.used_milli[row, c]), int(self._layout.used_mem[row, c]))
                for c, card in enumerate(r.cards)]

    def set_outside_usage(self, node_name: str, cpu_milli: int, memory_mib: int) -> None:
        """CPU and memory held on a node by pods outside the ledger: in the extender, every pod
        bound there (kube-scheduler owns CPU and memory and the extender holds only cards).

        Node policies see it in a node's free CPU and memory, which FGD's fit test needs; fit
        checks it only with `check_host_resources`. Kept for nodes not (yet) known, so it
        applies when they appear; (0, 0) forgets the node."""
        lay = self._layout
        usage = (max(0, cpu_milli), max(0, memory_mib))
        old = lay.outside.get(node_name, (0, 0))
        if usage == old:
            return
        if usage == (0, 0):
            del lay.outside[node_name]
        else:
            lay.outside[node_name] = usage
        row = lay.row_of.get(node_name)
        if lay.stale or row is None:
            return  # the next refresh counts it
        lay.touch(row)
        lay.cpu_used[row] += usage[0] - old[0]
        lay.mem_used[row] += usage[1] - old[1]
        self._scorer.forget_row(row)

    def host_usage(self, node_name: str) -> tuple[int, int]:
        """(CPU milli, memory MiB) held on the node by allocations and outside pods."""
        self._refresh()
        row = self._layout.row(node_name)
        return int(self._layout.cpu_used[row]), int(self._layout.mem_used[row])

    def free_cards(self, pod: PodRequest) -> FreeCards:
        """The cluster's cards and hosts as arrays, `usable` for this pod's GPU containers.
        Copies: the caller may change them."""
        self._refresh()
        lay = self._layout
        ok = fitmask.model_ok(lay, pod)
        for c in pod.gpu_containers:
            offer = lay.offer_mask(c.served_names)
            if offer is not None:
                ok = ok & offer
        return FreeCards(self.nodes(), ok.copy(), lay.cap_milli.copy(), lay.used_milli.copy(),
                         lay.cap_mem.copy(), lay.used_mem.copy(), lay.cpu_cap.copy(),
                         lay.cpu_used.copy(), lay.mem_cap.copy(), lay.mem_used.copy())

    def node_view(self, node_name: str) -> NodeView:
        self._refresh()
        return self._layout.view(self._layout.row(node_name))

    # ------------------------------------------------------------------ internals

    def _refresh(self) -> None:
        """Rebuild the arrays if the nodes changed, and replay the ledger onto them."""
        lay = self._layout
        if not lay.stale:
            return
        lay.rebuild()
        self.ctx.cluster_cpu_per_gpu = cluster_cpu_per_gpu(lay.nodes())
        self._scorer.clear()
        ledger.replay(lay, self._ledger)

    def _apply(self, pod_key: str, entry: ledger.Entry, sign: int) -> None:
        row = ledger.apply(self._layout, pod_key, entry, sign)
        if row is not None:
            self._scorer.forget_row(row)

    def _card_policy(self, name: str) -> CardPolicy:
        return self._scorer.card_policy(name)

    def _fit_mask(self, pod: PodRequest) -> BoolArray:
        """Which rows can host the pod (`fitmask.FitMasks`: kept per request shape, the rows
        changed since brought up to date). Callers must not mutate it."""
        return self._fit_masks.mask(self._layout, self.ctx, pod, self.config.check_host_resources,
                                    self._card_policy("binpack"))

    def _fits(self, pod: PodRequest, rows: IntArray) -> BoolArray:
        """Whether each of `rows` (-1: an unknown node, which never fits) can host the pod.

        A request names a sample of the cluster (kube-scheduler passes ~5% of 15,000 nodes):
        the fit of those rows alone, unless the whole cluster's is memoised or the sample is
        most of it."""
        if rows.size * 4 >= len(self._layout.rows) or self._fit_masks.holds(
                self._layout, fitmask.fit_key(pod, self.config.check_host_resources)):
            fits: BoolArray = np.append(self._fit_mask(pod), False)[rows]
            return fits
        known = rows >= 0
        out = np.zeros(rows.size, dtype=bool)
        out[known] = fitmask.fit_mask(self._layout, self.ctx, pod,
                                      self.config.check_host_resources,
                                      self._card_policy("binpack"), rows[known])
        return out

    def _mig_first(self, pod: PodRequest, rows: IntArray, scores: FloatArray) -> FloatArray:
        """A MIG pod's node scores with the nodes where its instances all go on partly held
        cards (`core.mig.pick.on_partly_held`) above every other: the node policy scores a MIG
        pod by its CPU only, and would open a card nothing holds on one node while another
        node's partly held card has the instance free. Other pods' scores unchanged. A node
        that holds no instance is passed over at once (a dict's truth), so the cost is in the
        nodes that hold some."""
        asked: dict[MigProfile, int] = {}
        for c in pod.gpu_containers:
            if c.kind is RequestKind.MIG and c.mig_profile is not None:
                asked[c.mig_profile] = asked.get(c.mig_profile, 0) + c.cards
        if rows.size == 0 or not asked:
            return scores
        layout = self._layout.rows
        first = np.fromiter(
            (bool(layout[row].mig_owner) and on_partly_held(
                layout[row].mig_cards(), layout[row].mig_owner.keys(), asked, pod.accepts_card)
             for row in rows.tolist()), dtype=bool, count=rows.size)
        if not first.any() or first.all():
            return scores
        out: FloatArray = scores + first * (float(np.ptp(scores)) + 1.0)
        return out

    def _why_not(self, row: int, pod: PodRequest) -> FitFailure | None:
        """Why the pod does not fit on this row (the first failing check), or None if it fits."""
        return explain.why_not(self._layout, self.ctx, self.config.check_host_resources,
                               self._card_policy("binpack"), row, pod)

    def _plan(self, row: int, pod: PodRequest, policy: CardPolicy
              ) -> dict[str, tuple[CardShare, ...]] | FitFailure:
        """Cards for every GPU container on this node, or why there are none."""
        return plan(self._layout, self.ctx, row, pod, policy, self.config.load_aware)
