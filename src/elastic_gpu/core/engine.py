"""The placement engine: fit, two-tier policy choice, and the allocation ledger. Pure, no I/O.

Data layout (see docs/architecture.md, "Placement engine"): nodes live in rows of NumPy arrays,
cards in a row-by-column matrix padded to the widest node, so that fit for the common requests
(one container: a share, N whole cards, or nothing) is a handful of vectorised comparisons over
the whole cluster. Requests the vectors do not cover (several GPU containers, MIG) are planned
per node in Python, exactly as `assign` does.

Usage is a function of the allocation ledger: whenever the set of nodes or cards changes, the
arrays are rebuilt and every allocation replayed onto them, so `upsert_node` keeps allocations on
cards that still exist. Node scores are cached per (policy, task shape) and node, and a node's
entries are dropped whenever anything is allocated or released on it: during a replay only the
node that just changed is scored again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import overload

import numpy as np
import numpy.typing as npt

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitFailure, FitKind, NoNodeFits, Unit
from elastic_gpu.core.fit import Unschedulable as Unschedulable  # re-exported: callers import it here
from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.model import Card, Node, cluster_cpu_per_gpu, offered
from elastic_gpu.core.policies import (
    CardPolicy,
    CardView,
    NodePolicy,
    NodeView,
    ScoreContext,
    default_card_policy,
)
from elastic_gpu.core.policies import card_policy as make_card_policy
from elastic_gpu.core.policies import node_policy as make_node_policy
from elastic_gpu.core.policies.node import MAX_SPEC_CPU, BinpackPolicy, SpreadPolicy
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MILLI_PER_CARD, Measure, lookup
from elastic_gpu.core.workload import DEFAULT_CPU_REQUEST, TargetWorkload, TaskShape

IntArray = npt.NDArray[np.int64]
#: Card matrices kept per resource name and per set of names before the caches start over.
_OFFER_CACHE_LIMIT = 256
#: What a card serves, as far as fit is concerned: (card offers, node offers, plain
#: cards of the node), the offers as sorted item tuples; None where unknown.
_OfferKey = tuple[tuple[tuple[str, int], ...] | None, tuple[tuple[str, int], ...] | None, int]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PolicyConfig:
    node_policy: str = "binpack"
    #: None: the card tier the node policy is paired with (`policies.default_card_policy`)
    card_policy: str | None = None
    #: CPU/memory of the node: the simulator checks them; the extender leaves that to
    #: kube-scheduler, which checks them itself.
    check_host_resources: bool = True


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


@dataclass
class _Ledger:
    """One allocation: what was given, and the host resources and task class it holds."""

    assignment: Assignment
    cpu_milli: int
    memory_mib: int
    tag: str | None


@dataclass
class _Row:
    node: Node
    cards: list[Card]  # sorted by index; column c of the matrices is cards[c]
    column: dict[int, int]  # card index -> column
    rank: float  # seeded tie-break: among equal scores the lowest rank wins
    mig_owner: dict[str, str] = field(default_factory=dict)  # MIG uuid -> pod key
    tags: Counter[str] = field(default_factory=Counter)


_UNKNOWN_NODE = FitFailure(FitKind.UNKNOWN_NODE)
#: a node that fit says no to and `_why_not` cannot explain (never expected; honest if it is)
_UNDETAILED = FitFailure(FitKind.UNDETAILED)


def _restricts_models(pod: PodRequest) -> bool:
    """Card counts in a failure are among the accepted models only (the sentence says so)."""
    return pod.allowed_models is not None or bool(pod.denied_models)


def task_shape(pod: PodRequest) -> TaskShape:
    """A pod reduced to what node policies score: CPU (0 counts as 100, like kube-scheduler),
    compute per card, number of cards, accepted models, host memory. Several GPU containers add
    up their cards at the largest per-card compute; MIG requests score as CPU-only."""
    cpu = pod.cpu_milli if pod.cpu_milli > 0 else DEFAULT_CPU_REQUEST
    models = pod.allowed_models or frozenset()
    gpu = [c for c in pod.gpu_containers if c.kind in (RequestKind.SHARE, RequestKind.WHOLE)]
    if not gpu:
        return TaskShape(cpu, 0, 0, models, pod.memory_mib)
    count = sum(c.cards for c in gpu)
    milli = max(c.compute_milli for c in gpu)
    if count > 1 or any(c.kind is RequestKind.WHOLE for c in gpu):
        milli = MILLI_PER_CARD if all(c.kind is RequestKind.WHOLE for c in gpu) else milli
    return TaskShape(cpu, milli, count, models, pod.memory_mib)


def _assignment_tag(assignment: Assignment) -> str | None:
    shares = [s for s in assignment.shares() if s.mig_uuid is None]
    if not shares:
        return None
    if len(shares) == 1 and shares[0].milli < MILLI_PER_CARD:
        return "share-gpu"
    return f"{len(shares)}-gpu"


class _LazyViews(Sequence[NodeView]):
    """Node views built only when a policy looks at them (random never does)."""

    def __init__(self, engine: Engine, rows: Sequence[int]) -> None:
        self._engine = engine
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> NodeView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[NodeView]: ...
    def __getitem__(self, i: int | slice) -> NodeView | Sequence[NodeView]:
        if isinstance(i, slice):
            return [self._engine._view(r) for r in self._rows[i]]
        return self._engine._view(self._rows[i])

    def __iter__(self) -> Iterator[NodeView]:
        return (self._engine._view(r) for r in self._rows)


class Engine:
    """Nodes, allocations, and placement decisions over them."""

    def __init__(self, nodes: Iterable[Node] = (), config: PolicyConfig = PolicyConfig(),
                 seed: int = 0, workload: TargetWorkload | None = None) -> None:
        self.config = config
        root = np.random.default_rng(seed)
        self._rank_rng = np.random.default_rng(root.integers(2**63))
        self.ctx = ScoreContext(Fragmentation(workload or TargetWorkload.default()),
                                np.random.default_rng(root.integers(2**63)))
        make_node_policy(config.node_policy)  # fail early on a bad name
        make_card_policy(config.card_policy or default_card_policy(config.node_policy))
        self._node_policies: dict[str, NodePolicy] = {}
        self._card_policies: dict[str, CardPolicy] = {}
        self._rows: list[_Row] = []
        self._row_of: dict[str, int] = {}
        self._ledger: dict[str, _Ledger] = {}
        #: node name -> (CPU milli, memory MiB) held by pods outside the ledger
        self._outside: dict[str, tuple[int, int]] = {}
        self._models: list[str] = []
        self._model_id: dict[str, int] = {}
        self._score_cache: dict[tuple[str, TaskShape], FloatArray] = {}
        self._stale = True
        #: bumped by every change of usage or layout: the fit-mask memo is valid while equal
        self._generation = 0
        self._mask_memo: tuple[int, PodRequest, BoolArray] | None = None
        #: offer classes of cards (see `_OfferKey`) and, per resource name and per distinct set
        #: of written names, the card matrices derived from them; rebuilt with the layout
        self._offer_keys: list[_OfferKey] = []
        self._constrained = False
        self._count_cache: dict[str, IntArray] = {}
        self._names_cache: dict[tuple[str, ...], BoolArray] = {}
        for node in nodes:
            self.upsert_node(node)

    def set_workload(self, workload: TargetWorkload) -> None:
        """Score against another target workload from now on (the extender's observed one)."""
        self.ctx = ScoreContext(Fragmentation(workload), self.ctx.rng,
                                self.ctx.cluster_cpu_per_gpu)
        self._score_cache.clear()
        self._generation += 1

    @property
    def cluster_cpu_per_gpu(self) -> float | None:
        """The CPU (milli) per milli-card of the current nodes (`model.cluster_cpu_per_gpu`):
        what a target workload's CPU pressure is measured against."""
        self._refresh()
        return self.ctx.cluster_cpu_per_gpu

    # ------------------------------------------------------------------ inventory

    def upsert_node(self, node: Node) -> None:
        cards = sorted(node.cards, key=lambda c: c.index)
        row = self._row_of.get(node.name)
        if row is None:
            self._row_of[node.name] = len(self._rows)
            self._rows.append(_Row(node, cards, {c.index: i for i, c in enumerate(cards)},
                                   float(self._rank_rng.random())))
        else:
            old = self._rows[row]
            self._rows[row] = _Row(node, cards, {c.index: i for i, c in enumerate(cards)}, old.rank)
        for card in cards:
            self._model_index(card.model)
        self._stale = True

    def remove_node(self, name: str) -> None:
        if name not in self._row_of:
            return
        self._rows = [r for r in self._rows if r.node.name != name]
        self._row_of = {r.node.name: i for i, r in enumerate(self._rows)}
        self._stale = True

    def nodes(self) -> list[str]:
        return [r.node.name for r in self._rows]

    def node(self, name: str) -> Node:
        return self._rows[self._row(name)].node

    # ------------------------------------------------------------------ decisions

    def filter(self, pod: PodRequest, node_names: Sequence[str] | None = None) -> FilterResult:
        self._refresh()
        names = list(node_names) if node_names is not None else self.nodes()
        mask = self._fit_mask(pod)
        feasible: list[str] = []
        failed: dict[str, FitFailure] = {}
        for name in names:
            row = self._row_of.get(name)
            if row is None:
                failed[name] = _UNKNOWN_NODE
            elif mask[row]:
                feasible.append(name)
            else:
                failed[name] = self._why_not(row, pod) or _UNDETAILED
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
        fit = np.append(self._fit_mask(pod), False)[rows]  # row -1 (unknown) reads the False
        names = np.array(node_names, dtype=object)
        scores = self._scores(self._node_policy(name), task_shape(pod), rows[fit])
        return ScoredNodes(names[fit].tolist(), scores, names[~fit].tolist())

    def rows_of(self, node_names: Sequence[str]) -> IntArray:
        """Row of each named node, -1 for unknown names (dict lookups at C speed)."""
        return np.fromiter(map(self._row_of.get, node_names, repeat(-1)), dtype=np.int64,
                           count=len(node_names))

    def best(self, pod: PodRequest, node_names: Sequence[str], policy: str | None = None
             ) -> str | None:
        """The node `place` would choose among the named ones (highest score, the seeded rank
        breaking ties), or None when none of them fits."""
        self._refresh()
        rows = self.rows_of(node_names)
        rows = rows[np.append(self._fit_mask(pod), False)[rows]]
        if rows.size == 0:
            return None
        return self._rows[self._best_row(pod, rows, policy)].node.name

    def _best_row(self, pod: PodRequest, rows: IntArray, policy: str | None) -> int:
        chosen = self._node_policy(policy or pod.node_policy or self.config.node_policy)
        scores = self._scores(chosen, task_shape(pod), rows)
        tied = rows[scores == scores.max()]
        return int(tied[np.argmin(self._rank[tied])]) if tied.size > 1 else int(tied[0])

    def assign(self, pod: PodRequest, node_name: str, card_policy: str | None = None) -> Assignment:
        self._refresh()
        row = self._row(node_name)
        if not self._host_fits(row, pod):
            raise Unschedulable(self._why_not(row, pod) or _UNDETAILED, node_name)
        chosen = self._card_policy(card_policy or self.card_policy_for(pod))
        plan = self._plan(row, pod, chosen)
        if isinstance(plan, FitFailure) and chosen.name != "binpack":
            # Fit is defined by the tightest-first plan; a card policy's greedy choice for one
            # container must not make a later container of the same pod fail where that fits.
            plan = self._plan(row, pod, self._card_policy("binpack"))
        if isinstance(plan, FitFailure):
            # a node-level check (health, models) says it better than the first short container
            why = self._why_not(row, pod)
            node_level = why is not None and why.kind in (FitKind.NO_HEALTHY_GPU,
                                                           FitKind.MODEL_NOT_ACCEPTED)
            raise Unschedulable(why if why is not None and node_level else plan, node_name)
        return Assignment(node_name, plan)

    def card_policy_for(self, pod: PodRequest) -> str:
        """The card tier a pod's cards are chosen by: the pod's annotation, else the configured
        one, else the one its node policy is paired with (`policies.default_card_policy`, the
        pairing `egpu simulate` measures)."""
        return (pod.card_policy or self.config.card_policy
                or default_card_policy(pod.node_policy or self.config.node_policy))

    def place(self, pod: PodRequest) -> Assignment:
        self._refresh()
        if not self._rows:
            raise Unschedulable(FitFailure(FitKind.NO_NODES))
        mask = self._fit_mask(pod)
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            raise self._unschedulable(pod)
        row = self._best_row(pod, rows, None)
        return self.assign(pod, self._rows[row].node.name)

    # ------------------------------------------------------------------ ledger

    def allocate(self, pod_key: str, assignment: Assignment, pod: PodRequest | None = None) -> None:
        """Record an assignment. With `pod` given (and host checks on) its CPU and memory are
        held on the node too. Raises Unschedulable if anything would exceed a capacity; the same
        key and assignment again is a no-op; a different assignment replaces the old one."""
        self._refresh()
        cpu = pod.cpu_milli if pod is not None and self.config.check_host_resources else 0
        mem = pod.memory_mib if pod is not None and self.config.check_host_resources else 0
        entry = _Ledger(assignment, cpu, mem, _assignment_tag(assignment))
        old = self._ledger.get(pod_key)
        if old is not None:
            if old == entry:
                return
            self.release(pod_key)
        try:
            self._check(pod_key, entry)
        except Unschedulable:
            if old is not None:
                self._apply(pod_key, old, +1)
                self._ledger[pod_key] = old
            raise
        self._apply(pod_key, entry, +1)
        self._ledger[pod_key] = entry

    def release(self, pod_key: str) -> Assignment | None:
        self._refresh()
        entry = self._ledger.pop(pod_key, None)
        if entry is None:
            return None
        self._apply(pod_key, entry, -1)
        return entry.assignment

    def allocation(self, pod_key: str) -> Assignment | None:
        entry = self._ledger.get(pod_key)
        return entry.assignment if entry else None

    def allocations(self) -> Mapping[str, Assignment]:
        return {k: v.assignment for k, v in self._ledger.items()}

    def card_usage(self, node_name: str) -> list[tuple[int, int, int]]:
        self._refresh()
        row = self._row(node_name)
        r = self._rows[row]
        return [(card.index, int(self._used_milli[row, c]), int(self._used_mem[row, c]))
                for c, card in enumerate(r.cards)]

    def set_outside_usage(self, node_name: str, cpu_milli: int, memory_mib: int) -> None:
        """CPU and memory held on a node by pods outside the ledger: in the extender, every pod
        bound there (kube-scheduler owns CPU and memory and the extender holds only cards).

        Node policies see it in a node's free CPU and memory, which FGD's fit test needs; fit
        checks it only with `check_host_resources`. Kept for nodes not (yet) known, so it
        applies when they appear; (0, 0) forgets the node."""
        usage = (max(0, cpu_milli), max(0, memory_mib))
        old = self._outside.get(node_name, (0, 0))
        if usage == old:
            return
        if usage == (0, 0):
            del self._outside[node_name]
        else:
            self._outside[node_name] = usage
        row = self._row_of.get(node_name)
        if self._stale or row is None:
            return  # the next refresh counts it
        self._generation += 1
        self._cpu_used[row] += usage[0] - old[0]
        self._mem_used[row] += usage[1] - old[1]
        for cached in self._score_cache.values():
            cached[row] = np.nan

    def host_usage(self, node_name: str) -> tuple[int, int]:
        """(CPU milli, memory MiB) held on the node by allocations and outside pods."""
        self._refresh()
        row = self._row(node_name)
        return int(self._cpu_used[row]), int(self._mem_used[row])

    def node_view(self, node_name: str) -> NodeView:
        self._refresh()
        return self._view(self._row(node_name))

    # ------------------------------------------------------------------ internals: layout

    def _row(self, name: str) -> int:
        try:
            return self._row_of[name]
        except KeyError:
            raise Unschedulable(_UNKNOWN_NODE, name) from None

    def _model_index(self, model: str) -> int:
        idx = self._model_id.get(model)
        if idx is None:
            idx = self._model_id[model] = len(self._models)
            self._models.append(model)
        return idx

    def _refresh(self) -> None:
        if not self._stale:
            return
        self._generation += 1
        n = len(self._rows)
        width = max((len(r.cards) for r in self._rows), default=0) or 1
        self._cpu_cap: IntArray = np.array([r.node.cpu_milli for r in self._rows], dtype=np.int64)
        self._mem_cap: IntArray = np.array([r.node.memory_mib for r in self._rows], dtype=np.int64)
        self._cpu_used: IntArray = np.zeros(n, dtype=np.int64)
        self._mem_used: IntArray = np.zeros(n, dtype=np.int64)
        self._rank: FloatArray = np.array([r.rank for r in self._rows], dtype=np.float64)
        self._exists: BoolArray = np.zeros((n, width), dtype=bool)
        self._usable: BoolArray = np.zeros((n, width), dtype=bool)
        self._mig_card: BoolArray = np.zeros((n, width), dtype=bool)
        self._cap_milli: IntArray = np.zeros((n, width), dtype=np.int64)
        self._cap_mem: IntArray = np.zeros((n, width), dtype=np.int64)
        self._used_milli: IntArray = np.zeros((n, width), dtype=np.int64)
        self._used_mem: IntArray = np.zeros((n, width), dtype=np.int64)
        self._card_model: IntArray = np.zeros((n, width), dtype=np.int64)
        #: time-sliced replica slots held per card (shares with `replicas`)
        self._used_rep: IntArray = np.zeros((n, width), dtype=np.int64)
        #: offer class per card; padding cells hold the spare class past the end (offers nothing)
        self._card_offer: IntArray = np.zeros((n, width), dtype=np.int64)
        offer_id: dict[_OfferKey, int] = {}
        self._offer_keys = []
        self._count_cache.clear()
        self._names_cache.clear()
        offer_rows: list[list[int]] = []
        for i, r in enumerate(self._rows):
            r.mig_owner.clear()
            r.tags.clear()
            node_offers = (tuple(r.node.offers.items()) if r.node.offers is not None else None)
            silent = -1  # the class of this row's cards that say nothing, once needed
            ids: list[int] = []
            for c, card in enumerate(r.cards):
                self._exists[i, c] = True
                self._usable[i, c] = card.healthy and not card.mig_enabled
                self._mig_card[i, c] = card.mig_enabled
                self._cap_milli[i, c] = card.compute_milli
                self._cap_mem[i, c] = card.memory_mib
                self._card_model[i, c] = self._model_index(card.model)
                if card.offers is None and silent >= 0:
                    ids.append(silent)
                    continue
                okey: _OfferKey
                if card.offers is None:
                    # only these cards split the node's whole-card count over its plain cards
                    # (the count is the Node's capacity: every card, healthy or not)
                    plain = (sum(1 for k in r.cards if not k.mig_enabled)
                             if node_offers is not None else 0)
                    okey = (None, node_offers, plain)
                else:
                    okey = (tuple(card.offers.items()), node_offers, 0)
                idx = offer_id.get(okey)
                if idx is None:
                    idx = offer_id[okey] = len(self._offer_keys)
                    self._offer_keys.append(okey)
                if card.offers is None:
                    silent = idx
                ids.append(idx)
            offer_rows.append(ids)
        # padding cells (and rows without cards) get the spare class, which offers nothing
        self._card_offer.fill(len(self._offer_keys))
        for i, ids in enumerate(offer_rows):
            self._card_offer[i, :len(ids)] = ids
        self._constrained = any(k[0] is not None or k[1] is not None for k in self._offer_keys)
        for name, (cpu, mem) in self._outside.items():
            row = self._row_of.get(name)
            if row is not None:
                self._cpu_used[row] += cpu
                self._mem_used[row] += mem
        self.ctx.cluster_cpu_per_gpu = cluster_cpu_per_gpu(r.node for r in self._rows)
        self._score_cache.clear()
        self._stale = False
        # Replay the ledger; drop shares on cards that no longer exist.
        for key, entry in list(self._ledger.items()):
            row = self._row_of.get(entry.assignment.node)
            if row is None:
                continue
            kept = {name: tuple(s for s in shares if s.index in self._rows[row].column)
                    for name, shares in entry.assignment.containers.items()}
            entry = _Ledger(Assignment(entry.assignment.node, kept), entry.cpu_milli,
                            entry.memory_mib, entry.tag)
            self._ledger[key] = entry
            self._apply(key, entry, +1)

    def _apply(self, pod_key: str, entry: _Ledger, sign: int) -> None:
        row = self._row_of.get(entry.assignment.node)
        if row is None:
            return
        self._generation += 1
        r = self._rows[row]
        self._cpu_used[row] += sign * entry.cpu_milli
        self._mem_used[row] += sign * entry.memory_mib
        for share in entry.assignment.shares():
            col = r.column.get(share.index)
            if col is None:
                continue
            if share.mig_uuid is not None:
                if sign > 0:
                    r.mig_owner[share.mig_uuid] = pod_key
                else:
                    r.mig_owner.pop(share.mig_uuid, None)
            self._used_milli[row, col] += sign * share.milli
            self._used_mem[row, col] += sign * share.memory_mib
            self._used_rep[row, col] += sign * share.replicas
        if entry.tag is not None:
            r.tags[entry.tag] += sign
            if r.tags[entry.tag] <= 0:
                del r.tags[entry.tag]
        for cached in self._score_cache.values():
            cached[row] = np.nan

    def _check(self, pod_key: str, entry: _Ledger) -> None:
        assignment = entry.assignment
        row = self._row(assignment.node)
        r = self._rows[row]
        node = r.node.name
        if self._cpu_used[row] + entry.cpu_milli > self._cpu_cap[row]:
            raise Unschedulable(FitFailure(
                FitKind.HOST_CPU, "cpu", entry.cpu_milli, int(self._cpu_cap[row] - self._cpu_used[row]),
                int(self._cpu_cap[row]), Unit.MILLI_CPU), node)
        if self._mem_used[row] + entry.memory_mib > self._mem_cap[row]:
            raise Unschedulable(FitFailure(
                FitKind.HOST_MEMORY, "memory", entry.memory_mib,
                int(self._mem_cap[row] - self._mem_used[row]), int(self._mem_cap[row]), Unit.MIB), node)
        add_milli: Counter[int] = Counter()
        add_mem: Counter[int] = Counter()
        add_rep: Counter[int] = Counter()
        for share in assignment.shares():
            col = r.column.get(share.index)
            if col is None:
                raise Unschedulable(FitFailure(FitKind.NO_SUCH_CARD, card=share.index), node)
            card = r.cards[col]
            if share.mig_uuid is not None:
                instance = next((m for m in card.mig if m.uuid == share.mig_uuid), None)
                if instance is None:
                    raise Unschedulable(FitFailure(FitKind.NO_SUCH_MIG_INSTANCE, card=card.index,
                                                   instance=share.mig_uuid), node)
                owner = r.mig_owner.get(share.mig_uuid)
                if owner is not None and owner != pod_key:
                    raise Unschedulable(FitFailure(FitKind.MIG_INSTANCE_HELD, card=card.index,
                                                   instance=share.mig_uuid, holder=owner), node)
                continue
            if card.mig_enabled:
                raise Unschedulable(FitFailure(FitKind.MIG_ENABLED_CARD, card=card.index), node)
            add_milli[col] += share.milli
            add_mem[col] += share.memory_mib
            add_rep[col] += share.replicas
        for col, count in add_rep.items():
            card = r.cards[col]
            slots = self._replica_slots(row, col)
            if self._used_rep[row, col] + count > slots:
                raise Unschedulable(FitFailure(
                    FitKind.CARD_REPLICAS, "", count, max(0, slots - int(self._used_rep[row, col])),
                    slots, Unit.REPLICAS, card=card.index), node)
        for col, milli in add_milli.items():
            card = r.cards[col]
            if self._used_milli[row, col] + milli > card.compute_milli:
                raise Unschedulable(FitFailure(
                    FitKind.CARD_COMPUTE, "", milli,
                    int(card.compute_milli - self._used_milli[row, col]), card.compute_milli,
                    Unit.MILLI_CARDS, card=card.index), node)
            if self._used_mem[row, col] + add_mem[col] > card.memory_mib:
                raise Unschedulable(FitFailure(
                    FitKind.CARD_MEMORY, "", add_mem[col],
                    int(card.memory_mib - self._used_mem[row, col]), card.memory_mib, Unit.MIB,
                    card=card.index), node)

    # ------------------------------------------------------------------ internals: fit

    def _host_mask(self, pod: PodRequest) -> BoolArray:
        if not self.config.check_host_resources:
            return np.ones(len(self._rows), dtype=bool)
        return ((self._cpu_cap - self._cpu_used >= pod.cpu_milli)
                & (self._mem_cap - self._mem_used >= pod.memory_mib))

    def _host_fits(self, row: int, pod: PodRequest) -> bool:
        if not self.config.check_host_resources:
            return True
        return bool(self._cpu_cap[row] - self._cpu_used[row] >= pod.cpu_milli
                    and self._mem_cap[row] - self._mem_used[row] >= pod.memory_mib)

    def _model_ok(self, pod: PodRequest) -> BoolArray:
        # one spare entry: padding cells of the card matrix hold model id 0 even with no models
        accepted = np.array([pod.accepts_model(m) for m in self._models] + [False], dtype=bool)
        out: BoolArray = self._usable & accepted[self._card_model]
        return out

    # ------------------------------------------------------------------ internals: offers

    @staticmethod
    def _key_count(key: _OfferKey, name: str) -> int:
        """Devices of `name` a card of this offer class serves (see `model.offered`): what the
        card offers, within what its Node advertises; a card that says nothing (an older
        agent) gets the node's whole-card count split over its plain cards; nothing
        known at all serves every name once (the simulator)."""
        card_offers, node_offers, plain = key
        if node_offers is not None and offered(dict(node_offers), name) == 0:
            return 0
        if card_offers is not None:
            return offered(dict(card_offers), name)
        if node_offers is not None:
            count = offered(dict(node_offers), name)
            spec = lookup(name)
            if spec is not None and spec.measure is Measure.CARDS:
                return max(1, count // max(1, plain))
            return count
        return 1

    def _counts(self, name: str) -> IntArray:
        """Devices of `name` per card cell (0 where not offered, and in padding cells)."""
        cached = self._count_cache.get(name)
        if cached is None:
            if len(self._count_cache) >= _OFFER_CACHE_LIMIT:
                self._count_cache.clear()  # bounded: requests may name any MIG profile
            table = np.array([self._key_count(k, name) for k in self._offer_keys] + [0],
                             dtype=np.int64)
            counts: IntArray = table[self._card_offer]
            cached = self._count_cache[name] = counts
        return cached

    def _offer_mask(self, names: tuple[str, ...]) -> BoolArray | None:
        """Cards that serve every one of `names` (a container's written GPU resources); None
        when no card or node says what it offers (every card serves everything)."""
        if not self._constrained or not names:
            return None
        cached = self._names_cache.get(names)
        if cached is None:
            if len(self._names_cache) >= _OFFER_CACHE_LIMIT:
                self._names_cache.clear()
            mask = self._exists.copy()
            for name in names:
                mask &= self._counts(name) > 0
            cached = self._names_cache[names] = mask
        return cached

    @staticmethod
    def _replica_name(c: ContainerRequest) -> str | None:
        """The whole-card resource a WHOLE container wrote (its replicas, if time-sliced)."""
        if c.kind is not RequestKind.WHOLE:
            return None
        for name in c.resources:
            spec = lookup(name)
            if spec is not None and spec.measure is Measure.CARDS:
                return name
        return None

    def _replica_slots(self, row: int, col: int) -> int:
        """Time-sliced replicas a card has in all: its largest whole-card offer above 1."""
        key = self._offer_keys[int(self._card_offer[row, col])]
        names = {n for part in key[:2] if part is not None for n, _ in part
                 if (spec := lookup(n)) is not None and spec.measure is Measure.CARDS}
        best = max((self._key_count(key, n) for n in names), default=0)
        return best if best > 1 else 0

    def _whole_slots(self, c: ContainerRequest, ok: BoolArray, rows: slice = slice(None)
                     ) -> IntArray:
        """Per card cell of `rows` (`ok` has their shape), how many of container c's N
        whole-card units it can take: 1 for an entirely free card; for a card time-sliced for
        the resource c wrote (it offers r > 1 devices of it), its free replica slots, each
        costing compute // r milli-cards and no memory (so shares and replicas on one card
        never exceed it)."""
        cap_milli, used_milli = self._cap_milli[rows], self._used_milli[rows]
        fits_mem = self._cap_mem[rows] >= c.memory_mib
        slots: IntArray = (ok & (used_milli == 0) & (self._used_mem[rows] == 0)
                           & fits_mem).astype(np.int64)
        name = self._replica_name(c)
        if name is None or not self._constrained:
            return slots
        rep = self._counts(name)[rows]
        sliced = ok & (rep > 1) & fits_mem
        if not sliced.any():
            return slots
        per = cap_milli // np.maximum(rep, 1)
        by_milli = np.where(per > 0, (cap_milli - used_milli) // np.maximum(per, 1), rep)
        free = np.maximum(np.minimum(rep - self._used_rep[rows], by_milli), 0)
        out: IntArray = np.where(sliced, free, slots)
        return out

    def _fit_mask(self, pod: PodRequest) -> BoolArray:
        """Which rows can host the pod. Memoised for the last pod while nothing changed: the
        extender asks filter and then prioritize for the same pod. Callers must not mutate it."""
        memo = self._mask_memo
        if memo is not None and memo[0] == self._generation and (memo[1] is pod or memo[1] == pod):
            return memo[2]
        mask = self._compute_fit_mask(pod)
        self._mask_memo = (self._generation, pod, mask)
        return mask

    def _compute_fit_mask(self, pod: PodRequest) -> BoolArray:
        host = self._host_mask(pod)
        gpu = pod.gpu_containers
        if not gpu:
            return host
        if len(gpu) == 1 and gpu[0].kind in (RequestKind.SHARE, RequestKind.WHOLE):
            c = gpu[0]
            ok = self._model_ok(pod)
            offer = self._offer_mask(c.resources)
            if offer is not None:
                ok = ok & offer
            if c.kind is RequestKind.SHARE:
                cards = (ok & (self._cap_milli - self._used_milli >= c.compute_milli)
                         & (self._cap_mem - self._used_mem >= c.memory_mib))
                share_ok: BoolArray = host & cards.any(axis=1)
                return share_ok
            whole_ok: BoolArray = host & (self._whole_slots(c, ok).sum(axis=1) >= c.cards)
            return whole_ok
        binpack = self._card_policy("binpack")
        out = host.copy()
        for row in np.flatnonzero(host):
            out[row] = not isinstance(self._plan(int(row), pod, binpack), FitFailure)
        return out

    def _why_not(self, row: int, pod: PodRequest) -> FitFailure | None:
        """Why the pod does not fit on this row (the first failing check), or None if it fits."""
        r = self._rows[row]
        if self.config.check_host_resources:
            cpu_free = int(self._cpu_cap[row] - self._cpu_used[row])
            if cpu_free < pod.cpu_milli:
                return FitFailure(FitKind.HOST_CPU, "cpu", pod.cpu_milli, cpu_free,
                                  int(self._cpu_cap[row]), Unit.MILLI_CPU)
            mem_free = int(self._mem_cap[row] - self._mem_used[row])
            if mem_free < pod.memory_mib:
                return FitFailure(FitKind.HOST_MEMORY, "memory", pod.memory_mib, mem_free,
                                  int(self._mem_cap[row]), Unit.MIB)
        gpu = pod.gpu_containers
        if not gpu:
            return None
        if not any(self._usable[row, c] or r.cards[c].mig_enabled for c in range(len(r.cards))):
            return FitFailure(FitKind.NO_HEALTHY_GPU, capacity=len(r.cards), unit=Unit.CARDS)
        models = {r.cards[c].model for c in range(len(r.cards))}
        if not any(pod.accepts_model(m) for m in models):
            return FitFailure(FitKind.MODEL_NOT_ACCEPTED, offered=tuple(sorted(models)),
                              allowed=(tuple(sorted(pod.allowed_models))
                                       if pod.allowed_models is not None else None),
                              denied=tuple(sorted(pod.denied_models)))
        missing = self._missing_offer(row, gpu)
        if missing is not None:
            return missing
        if len(gpu) == 1 and gpu[0].kind in (RequestKind.SHARE, RequestKind.WHOLE):
            # What `_plan` would say for one share or whole-card container, from the arrays
            # (the extender explains failed nodes per request; planning each costs ~0.1 ms).
            c = gpu[0]
            n = len(r.cards)
            ok = self._usable[row, :n] & np.array([pod.accepts_model(card.model) for card in r.cards],
                                                   dtype=bool)
            offer = self._offer_mask(c.resources)
            if offer is not None:
                ok = ok & offer[row, :n]
            if c.kind is RequestKind.SHARE:
                cand = ok & (self._cap_milli[row, :n] - self._used_milli[row, :n] >= c.compute_milli) \
                    & (self._cap_mem[row, :n] - self._used_mem[row, :n] >= c.memory_mib)
                return None if cand.any() else self._share_failure(pod, c, n)
            cells = np.zeros((1, self._usable.shape[1]), dtype=bool)
            cells[0, :n] = ok
            count = int(self._whole_slots(c, cells, slice(row, row + 1)).sum())
            return None if count >= c.cards else self._whole_shortfall(pod, row, c, count)
        plan = self._plan(row, pod, self._card_policy("binpack"))
        return plan if isinstance(plan, FitFailure) else None

    def _missing_offer(self, row: int, gpu: Sequence[ContainerRequest]) -> FitFailure | None:
        """Why the node serves no container's resource at all (vendor, name), if so: the
        first written name no card of the node offers."""
        if not self._constrained:
            return None
        r = self._rows[row]
        n = len(r.cards)
        for c in gpu:
            for res in c.resources:
                if not (self._counts(res)[row, :n] > 0).any():
                    return FitFailure(FitKind.RESOURCE_NOT_OFFERED, res, capacity=n,
                                      unit=Unit.CARDS, container=c.name,
                                      offered=self._offered_names(row))
            offer = self._offer_mask(c.resources)
            if offer is not None and not offer[row, :n].any():
                return FitFailure(FitKind.RESOURCE_NOT_OFFERED, " and ".join(c.resources),
                                  capacity=n, unit=Unit.CARDS, container=c.name,
                                  offered=self._offered_names(row))
        return None

    def _offered_names(self, row: int) -> tuple[str, ...]:
        """The GPU resource names some card of the row offers (for messages)."""
        names: set[str] = set()
        for col in range(len(self._rows[row].cards)):
            key = self._offer_keys[int(self._card_offer[row, col])]
            names.update(n for part in key[:2] if part is not None for n, count in part
                         if count > 0 and self._key_count(key, n) > 0)
        return tuple(sorted(names))

    def _whole_shortfall(self, pod: PodRequest, row: int, c: ContainerRequest, count: int
                         ) -> FitFailure:
        """Too few whole-card units: entirely free cards, or time-sliced replica slots where
        the node's cards are time-sliced for the name the container wrote."""
        n = len(self._rows[row].cards)
        name = self._replica_name(c)
        if name is not None and self._constrained and (self._counts(name)[row, :n] > 1).any():
            total = int(self._counts(name)[row, :n].sum())
            return FitFailure(FitKind.INSUFFICIENT_REPLICAS, name, c.cards, count, total,
                              Unit.REPLICAS, c.name, _restricts_models(pod))
        return self._cards_failure(pod, c, count, n)

    @staticmethod
    def _share_failure(pod: PodRequest, c: ContainerRequest, cards: int) -> FitFailure:
        """No card has the share's compute and memory free (one of `cards` cards)."""
        return FitFailure(FitKind.INSUFFICIENT_SHARE, c.resources[0] if c.resources else "", 1, 0,
                          cards, Unit.CARDS, c.name, _restricts_models(pod),
                          per_card_milli=c.compute_milli, per_card_mib=c.memory_mib)

    @staticmethod
    def _cards_failure(pod: PodRequest, c: ContainerRequest, free: int, cards: int) -> FitFailure:
        """Too few entirely free cards: `free` of `cards`."""
        return FitFailure(FitKind.INSUFFICIENT_CARDS, c.resources[0] if c.resources else "",
                          c.cards, free, cards, Unit.CARDS, c.name, _restricts_models(pod))

    def _unschedulable(self, pod: PodRequest) -> Unschedulable:
        """Why no node fits, nodes counted by the category of their first failing check, in
        `_why_not`'s order (vectorised: this runs for every failed task of a replay)."""
        n = len(self._rows)
        left = np.ones(n, dtype=bool)
        counts: dict[str, int] = {}
        example: dict[str, int] = {}
        last: list[str] = []  # the categories in check order, as they rule nodes out

        def take(category: str, mask: BoolArray) -> None:
            hit = np.flatnonzero(left & mask)
            if hit.size:
                counts[category] = counts.get(category, 0) + int(hit.size)
                example.setdefault(category, int(hit[0]))
                left[hit] = False
                last.append(category)

        if self.config.check_host_resources:
            take(FitKind.HOST_CPU.category, self._cpu_cap - self._cpu_used < pod.cpu_milli)
            take(FitKind.HOST_MEMORY.category, self._mem_cap - self._mem_used < pod.memory_mib)
        if pod.gpu_containers:
            take(FitKind.NO_HEALTHY_GPU.category,
                 np.logical_not((self._usable | self._mig_card).any(axis=1)))
            accepted = np.array([pod.accepts_model(m) for m in self._models] + [False], dtype=bool)
            has_model: BoolArray = (self._exists & accepted[self._card_model]).any(axis=1)
            take(FitKind.MODEL_NOT_ACCEPTED.category, ~has_model)
            if self._constrained:
                no_offer = np.zeros(n, dtype=bool)
                for c in pod.gpu_containers:
                    offer = self._offer_mask(c.resources)
                    if offer is not None:
                        no_offer |= ~offer.any(axis=1)
                take(FitKind.RESOURCE_NOT_OFFERED.category, no_offer)
            kinds = {c.kind for c in pod.gpu_containers}
            take(FitKind.INSUFFICIENT_MIG.category if kinds == {RequestKind.MIG}
                 else FitKind.INSUFFICIENT_CARDS.category, left.copy())
        ordered = tuple(sorted(counts.items(), key=lambda kv: -kv[1]))
        category = ordered[0][0] if ordered else FitKind.UNKNOWN_NODE.category
        row = example.get(category)
        why = self._why_not(row, pod) if row is not None else None
        summary = NoNodeFits(pod.key, n, ordered, category,
                             self._rows[row].node.name if row is not None else None, why,
                             last[-1] if last else category)
        return Unschedulable(why or _UNDETAILED, summary.example_node, summary)

    def _plan(self, row: int, pod: PodRequest, policy: CardPolicy
              ) -> dict[str, tuple[CardShare, ...]] | FitFailure:
        """Cards for every GPU container on this node, or why there are none."""
        r = self._rows[row]
        cols = [c for c in range(len(r.cards)) if self._usable[row, c]
                and pod.accepts_model(r.cards[c].model)]
        cards = [r.cards[c] for c in cols]
        free_milli = [int(self._cap_milli[row, c] - self._used_milli[row, c]) for c in cols]
        free_mem = [int(self._cap_mem[row, c] - self._used_mem[row, c]) for c in cols]
        untouched = [bool(self._used_milli[row, c] == 0 and self._used_mem[row, c] == 0) for c in cols]
        used_rep = [int(self._used_rep[row, c]) for c in cols]
        view = CardView(self._view(row), task_shape(pod), cards, free_milli, free_mem)
        taken_mig: set[str] = set()
        plan: dict[str, tuple[CardShare, ...]] = {}

        def served(c: ContainerRequest) -> list[bool]:
            offer = self._offer_mask(c.resources)
            return [True] * len(cols) if offer is None else [bool(offer[row, col]) for col in cols]

        def order(c: ContainerRequest) -> tuple[int, int, int, int]:
            rank = {RequestKind.WHOLE: 0, RequestKind.MIG: 1, RequestKind.SHARE: 2}[c.kind]
            return (rank, -c.cards, -c.compute_milli, -c.memory_mib)

        for c in sorted(pod.gpu_containers, key=order):
            ok = served(c)
            if c.kind is RequestKind.WHOLE:
                replicas = self._plan_replicas(row, c, policy, view, cols, ok, untouched, used_rep,
                                               pod)
                if replicas is not None:
                    if isinstance(replicas, FitFailure):
                        return replicas
                    plan[c.name] = replicas
                    continue
                cand = [p for p in range(len(cards))
                        if ok[p] and untouched[p] and cards[p].memory_mib >= c.memory_mib]
                if len(cand) < c.cards:
                    return self._cards_failure(pod, c, len(cand), len(r.cards))
                picked = policy.pick_whole(self.ctx, view, cand, c.cards)
                shares = []
                for p in picked:
                    shares.append(CardShare(cards[p].index, cards[p].uuid, cards[p].compute_milli,
                                            cards[p].memory_mib))
                    free_milli[p] = free_mem[p] = 0
                    untouched[p] = False
                plan[c.name] = tuple(shares)
            elif c.kind is RequestKind.SHARE:
                cand = [p for p in range(len(cards))
                        if ok[p] and free_milli[p] >= c.compute_milli and free_mem[p] >= c.memory_mib]
                if not cand:
                    return self._share_failure(pod, c, len(r.cards))
                p = policy.pick_share(self.ctx, view, cand, c.compute_milli, c.memory_mib)
                free_milli[p] -= c.compute_milli
                free_mem[p] -= c.memory_mib
                untouched[p] = False
                plan[c.name] = (CardShare(cards[p].index, cards[p].uuid, c.compute_milli,
                                          c.memory_mib),)
            elif c.kind is RequestKind.MIG:
                assert c.mig_profile is not None
                found: list[CardShare] = []
                profile_total = 0
                mig_offer = self._offer_mask(c.resources)
                for col, card in enumerate(r.cards):
                    if not card.healthy or not pod.accepts_model(card.model):
                        continue
                    if mig_offer is not None and not mig_offer[row, col]:
                        continue
                    for inst in card.mig:
                        profile_total += inst.profile == c.mig_profile
                        if len(found) == c.cards:
                            continue
                        if (inst.profile == c.mig_profile and inst.health.value == "Healthy"
                                and inst.uuid not in r.mig_owner and inst.uuid not in taken_mig):
                            taken_mig.add(inst.uuid)
                            found.append(CardShare(card.index, card.uuid, 0,
                                                   c.mig_profile.memory_gb * 1024,
                                                   c.mig_profile.name, inst.uuid))
                if len(found) < c.cards:
                    return FitFailure(FitKind.INSUFFICIENT_MIG, c.mig_profile.resource_name, c.cards,
                                      len(found), profile_total, Unit.INSTANCES, c.name,
                                      _restricts_models(pod))
                plan[c.name] = tuple(found)
        return plan

    def _plan_replicas(self, row: int, c: ContainerRequest, policy: CardPolicy, view: CardView,
                       cols: list[int], ok: list[bool], untouched: list[bool], used_rep: list[int],
                       pod: PodRequest) -> tuple[CardShare, ...] | FitFailure | None:
        """A WHOLE container's N units where some served card is time-sliced for the resource
        it wrote (None otherwise: plain whole cards). A time-sliced card gives replica slots
        (r in all, each compute // r milli-cards, no memory); an entirely free plain card
        serving the name gives one whole unit. Each unit goes on a card of its own while
        there is one (the card policy picks as for a share of one slot), then replicas stack.
        Updates the view's free amounts, `untouched` and `used_rep` in place."""
        name = self._replica_name(c)
        if name is None or not self._constrained:
            return None
        counts = self._counts(name)
        cards = view.cards
        rep = [int(counts[row, col]) for col in cols]
        fits = [ok[p] and cards[p].memory_mib >= c.memory_mib for p in range(len(cols))]
        if not any(fits[p] and rep[p] > 1 for p in range(len(cols))):
            return None
        per = [cards[p].compute_milli // rep[p] if rep[p] > 1 else cards[p].compute_milli
               for p in range(len(cols))]

        def slots(p: int) -> int:
            if not fits[p]:
                return 0
            if rep[p] <= 1:
                return int(untouched[p])
            by_milli = view.free_milli[p] // per[p] if per[p] > 0 else rep[p]
            return max(0, min(rep[p] - used_rep[p], by_milli))

        total = sum(slots(p) for p in range(len(cols)))
        if total < c.cards:
            return self._whole_shortfall(pod, row, c, total)
        taken: dict[int, int] = {}
        for _ in range(c.cards):
            cand = [p for p in range(len(cols)) if p not in taken and slots(p) > 0]
            if not cand:  # more units than cards with room: replicas stack on sliced cards
                cand = [p for p in range(len(cols)) if rep[p] > 1 and slots(p) > 0]
            p = policy.pick_share(self.ctx, view, cand, per[cand[0]], 0)
            taken[p] = taken.get(p, 0) + 1
            untouched[p] = False
            if rep[p] > 1:
                used_rep[p] += 1
                view.free_milli[p] -= per[p]
            else:
                view.free_milli[p] = view.free_memory[p] = 0
        shares = []
        for p, k in taken.items():
            card = cards[p]
            if rep[p] > 1:
                shares.append(CardShare(card.index, card.uuid, k * per[p], 0, replicas=k))
            else:
                shares.append(CardShare(card.index, card.uuid, card.compute_milli, card.memory_mib))
        return tuple(shares)

    # ------------------------------------------------------------------ internals: scoring

    def _node_policy(self, name: str) -> NodePolicy:
        policy = self._node_policies.get(name)
        if policy is None:
            policy = self._node_policies[name] = make_node_policy(name)
        return policy

    def _card_policy(self, name: str) -> CardPolicy:
        policy = self._card_policies.get(name)
        if policy is None:
            policy = self._card_policies[name] = make_card_policy(name)
        return policy

    def _view(self, row: int) -> NodeView:
        r = self._rows[row]
        cols = [c for c in range(len(r.cards)) if self._usable[row, c]]
        free = tuple(int(self._cap_milli[row, c] - self._used_milli[row, c]) for c in cols)
        model = r.cards[cols[0]].model if cols else (r.cards[0].model if r.cards else "")
        return NodeView(row, r.node.name, model, int(self._cpu_cap[row]),
                        int(self._cpu_cap[row] - self._cpu_used[row]), int(self._mem_cap[row]),
                        int(self._mem_cap[row] - self._mem_used[row]), free, dict(r.tags))

    def _scores(self, policy: NodePolicy, task: TaskShape, rows: npt.NDArray[np.int64]) -> FloatArray:
        kind = type(policy)
        if kind is BinpackPolicy or kind is SpreadPolicy:
            # The classic rules as array arithmetic, operation for operation the same IEEE
            # doubles as their per-node `score` (a test compares them on random clusters).
            free = ((self._cap_milli[rows] - self._used_milli[rows]) * self._usable[rows]).sum(axis=1)
            gpu_left = free - task.total_milli
            cpu_left = self._cpu_cap[rows] - self._cpu_used[rows] - task.cpu_milli
            packed: FloatArray = -(gpu_left + cpu_left / (MAX_SPEC_CPU * 10))
            return packed if kind is BinpackPolicy else -packed
        if not policy.cacheable:
            return np.array(policy.score_batch(self.ctx, task, _LazyViews(self, rows.tolist())),
                            dtype=np.float64)
        if not policy.uses_memory and task.memory_mib:
            task = task.without_memory()  # one cache entry for tasks that differ only in memory
        key = (policy.name, task)
        cached = self._score_cache.get(key)
        if cached is None:
            if len(self._score_cache) > 4096:
                self._score_cache.clear()
            cached = self._score_cache[key] = np.full(len(self._rows), np.nan)
        values = cached[rows]
        missing = rows[np.isnan(values)]
        if missing.size:
            fresh = policy.score_batch(self.ctx, task, _LazyViews(self, missing.tolist()))
            cached[missing] = fresh
            values = cached[rows]
        return values
