"""The policy plug-in interface: node tier (score a node) and card tier (choose cards on it).

In the spirit of the kube-scheduler framework: the engine filters (fit is not a policy's
business), then asks one node policy to score each feasible node (higher is better), picks the
best node (ties: the node's seeded tie-break rank), then asks one card policy which cards of that
node each container gets. A policy sees read-only views, never the engine's arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.model import Card
from elastic_gpu.core.waste import ExpectedWaste
from elastic_gpu.core.workload import FGD_POPULARITY, TaskShape, cpu_pressure


@dataclass(frozen=True)
class NodeView:
    """What a node policy may know about one node, now."""

    index: int
    name: str
    #: model of the node's usable cards ("" when it has none); mixed nodes report the first
    model: str
    cpu_capacity: int
    cpu_free: int
    memory_capacity: int
    memory_free: int
    #: free milli-cards per usable card, in card order (MIG-enabled and unhealthy cards excluded)
    free: tuple[int, ...]
    #: placed pods per affinity tag ("share-gpu", "1-gpu", "2-gpu", ...)
    tags: Mapping[str, int] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return len(self.free)

    @property
    def free_total(self) -> int:
        return sum(self.free)

    @property
    def full_free(self) -> int:
        return sum(1 for f in self.free if f >= 1000)


@dataclass(frozen=True)
class NodeArrays:
    """The scored nodes as arrays, one entry per node (`rows` of the engine's matrices), for
    policies that score every node in one NumPy expression (`NodePolicy.score_arrays`).

    The engine hands over its whole matrices and the rows asked; each property reads only the
    rows, when a policy asks for it."""

    rows: npt.NDArray[np.int64]
    #: per node row and card column: compute capacity and use (milli-cards), and whether the
    #: card takes shares (healthy, not MIG-enabled); padding cells are not usable
    card_capacity: npt.NDArray[np.int64]
    card_used: npt.NDArray[np.int64]
    card_usable: npt.NDArray[np.bool_]
    #: per node row: CPU capacity and use (milli)
    cpu_capacity: npt.NDArray[np.int64]
    cpu_used: npt.NDArray[np.int64]
    #: per node row: host memory capacity and use (MiB)
    memory_capacity: npt.NDArray[np.int64]
    memory_used: npt.NDArray[np.int64]
    #: per node row and card column: whether a card is there, and its model (an index into
    #: `models`)
    card_exists: npt.NDArray[np.bool_]
    card_model: npt.NDArray[np.int64]
    models: Sequence[str]

    @property
    def free_total(self) -> npt.NDArray[np.int64]:
        """Free milli-cards on the usable cards of each node (`NodeView.free_total`)."""
        rows = self.rows
        free: npt.NDArray[np.int64] = ((self.card_capacity[rows] - self.card_used[rows])
                                       * self.card_usable[rows]).sum(axis=1)
        return free

    @property
    def cpu_free(self) -> npt.NDArray[np.int64]:
        """Free CPU (milli) of each node (`NodeView.cpu_free`)."""
        free: npt.NDArray[np.int64] = self.cpu_capacity[self.rows] - self.cpu_used[self.rows]
        return free

    @property
    def memory_free(self) -> npt.NDArray[np.int64]:
        """Free host memory (MiB) of each node (`NodeView.memory_free`)."""
        free: npt.NDArray[np.int64] = (self.memory_capacity[self.rows]
                                       - self.memory_used[self.rows])
        return free

    @property
    def card_free(self) -> npt.NDArray[np.int64]:
        """Per node and card column: free milli-cards of a usable card, -1 elsewhere (the
        cards of `NodeView.free`, in their order, at their columns)."""
        rows = self.rows
        free: npt.NDArray[np.int64] = np.where(self.card_usable[rows],
                                               self.card_capacity[rows] - self.card_used[rows], -1)
        return free

    @property
    def model(self) -> tuple[list[str], npt.NDArray[np.int64]]:
        """Each node's `NodeView.model` (its first usable card's, else its first card's, else
        ""), as the model names and each node's index into them."""
        rows = self.rows
        usable = self.card_usable[rows]
        any_usable = usable.any(axis=1)
        first = np.where(any_usable, usable.argmax(axis=1), 0)
        present = any_usable | self.card_exists[rows, 0]
        ids: npt.NDArray[np.int64] = np.where(present, self.card_model[rows, first],
                                              len(self.models))
        return [*self.models, ""], ids


@dataclass
class ScoreContext:
    """Shared services for policies: the fragmentation model, the seeded random source, the
    expected-waste model (built from the fragmentation model's target workload), and the
    cluster's CPU per milli-card (the engine sets it from its nodes; None until it has some)."""

    frag: Fragmentation
    rng: np.random.Generator
    cluster_cpu_per_gpu: float | None = None
    waste: ExpectedWaste = field(init=False)
    #: per node row, values a policy keeps while the node is unchanged (NaN: not known), by
    #: the policy's own key: the engine marks a row NaN in all of them whenever anything on
    #: that node changes, and drops them all when the rows are renumbered
    row_memo: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)

    def memo(self, key: str, rows: int) -> npt.NDArray[np.float64]:
        """The `row_memo` array under `key` for a layout of `rows` rows (new: all unknown)."""
        values = self.row_memo.get(key)
        if values is None or values.shape[0] != rows:
            values = self.row_memo[key] = np.full(rows, np.nan)
        return values

    def __post_init__(self) -> None:
        self.waste = ExpectedWaste(self.frag.workload)

    @property
    def cpu_pressure(self) -> float | None:
        """The target workload's CPU per GPU over the cluster's (`workload.cpu_pressure`)."""
        return cpu_pressure(self.frag.workload.cpu_per_gpu, self.cluster_cpu_per_gpu)


class NodePolicy(ABC):
    """Node tier: how good is placing a task of this shape on this node (higher is better)."""

    name: str = ""
    #: True when the score depends only on (node state, task shape): the engine may cache it
    #: per node until that node changes.
    cacheable: bool = True
    #: False when the score ignores the task's host memory: the engine then caches one score
    #: for tasks that differ only in memory (and scores them without it).
    uses_memory: bool = False
    #: the share of tasks the typical pods of the target workload cover when a replay or the
    #: extender builds that workload from tasks for this policy (FGD's measure reads it)
    popularity: float = FGD_POPULARITY
    #: True when `score_arrays` is worth caching like `score` (FGD's, a pass per shape over
    #: its fragmentation model): the engine then asks it only for the nodes whose cached score
    #: is missing; False (binpack, spread: a few array operations) asks it for every request.
    cache_arrays: bool = False
    #: the card tier this node policy is paired with when none is named: `egpu simulate
    #: --card-policy auto` and the extender without `cardPolicy` both use it
    #: (`policies.default_card_policy`), so the cluster gets the quality the simulator measures
    card_tier: str = "binpack"

    def popularity_for(self, tally: Mapping[TaskShape, int],
                       cluster_cpu_per_gpu: float | None = None) -> float:
        """The share of tasks the typical pods cover for this workload (shape -> how many
        tasks) on a cluster with this CPU per milli-card (`model.cluster_cpu_per_gpu`; None:
        unknown): `egpu simulate` builds a trace's target workload with it and the extender its
        observed one, so both adapt alike. Default: the fixed `popularity`."""
        return self.popularity

    @abstractmethod
    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float: ...

    def score_batch(self, ctx: ScoreContext, task: TaskShape, nodes: Sequence[NodeView]
                    ) -> list[float]:
        return [self.score(ctx, task, node) for node in nodes]

    def score_arrays(self, ctx: ScoreContext, task: TaskShape, nodes: NodeArrays
                     ) -> npt.NDArray[np.float64] | None:
        """Every node's `score` in one vectorised pass, the same IEEE doubles as `score`
        gives node by node; None (the default) when the policy has no such form, and the
        engine then scores node views (`score_batch`), cached while a node is unchanged."""
        return None

    def host_thresholds(self, ctx: ScoreContext, task: TaskShape) -> HostThresholds | None:
        """Whether this task's score reads its CPU (and memory) request only through what a
        node would have left compared with fixed values (`HostThresholds`): the engine then
        keeps one cached score per node for every task that differs only in CPU and memory,
        valid for the requests that leave the node on the same side of each value. None (the
        default): the score may read them any other way, and each shape is cached apart."""
        return None


@dataclass(frozen=True)
class HostThresholds:
    """A score reads a task's host requests only through `free CPU - cpu request >= t` for
    the t of `cpu`, and (`memory` not None) `free memory - memory request >= m` for the m of
    `memory` (both ascending); None: it does not read the memory request at all."""

    cpu: npt.NDArray[np.int64]
    memory: npt.NDArray[np.int64] | None


@dataclass
class CardView:
    """The cards of one node during one assignment: free amounts already reduce the containers
    of this pod placed before."""

    node: NodeView
    task: TaskShape  # the whole pod, reduced to a shape
    cards: Sequence[Card]  # usable cards, same order as free_milli
    free_milli: list[int]
    free_memory: list[int]
    #: the load-aware option (`PolicyConfig.load_aware`): per card, its observed (utilisation
    #: percent, used MiB), which breaks ties before the card index; None: off (ties by index)
    load: Sequence[tuple[int, int]] | None = None

    def tie(self, p: int) -> tuple[int, ...]:
        """The key a card policy breaks its ties by: the card index, with the load-aware
        option the card's observed utilisation and memory in use first (cooler cards win)."""
        index = self.cards[p].index
        if self.load is None:
            return (index,)
        return (*self.load[p], index)


class CardPolicy(ABC):
    """Card tier: which card(s) of the chosen node a container gets."""

    name: str = ""

    @abstractmethod
    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        """Position (into view.cards) of the card for a share; candidates all fit."""

    def pick_whole(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   count: int) -> list[int]:
        """Positions of `count` entirely free cards; default: the lowest card indexes (with
        the load-aware option the coolest cards, `CardView.tie`)."""
        return sorted(candidates, key=view.tie)[:count]

    def pick_shares(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                    milli: int, memory_mib: int, count: int) -> list[int]:
        """Positions of `count` distinct cards for a multi-card share (`milli` and
        `memory_mib` on each); candidates all fit and are at least `count`. Default: the
        policy's own `pick_share`, `count` times, each from the cards not yet picked."""
        left = list(candidates)
        picked: list[int] = []
        for _ in range(count):
            p = self.pick_share(ctx, view, left, milli, memory_mib)
            picked.append(p)
            left.remove(p)
        return picked


def share_runs(view: CardView, candidates: Sequence[int], count: int) -> list[list[int]]:
    """The placements of a multi-card share that fragmentation tells apart: the candidate
    cards ranked by free room (most first, ties by `CardView.tie`), and every run of `count`
    consecutive ones in that ranking (from the loosest `count` to the tightest). The
    fragmentation measure reads a node's free rooms as a multiset, so cards of equal room are
    interchangeable and these runs cover the states worth comparing (`node.free_after`)."""
    ranked = sorted(candidates, key=lambda p: (-view.free_milli[p], view.tie(p)))
    return [ranked[j:j + count] for j in range(len(ranked) - count + 1)]
