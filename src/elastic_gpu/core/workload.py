"""The target workload: which task shapes a cluster expects, and how often.

FGD (Weng et al., ATC'23) scores a node by how much of its idle GPU capacity the *expected* next
task could not use. "Expected" is a distribution over task shapes, called the typical pods in the
authors' simulator: the most frequent shapes of the workload that together cover a popularity
threshold (95%, `FGD_POPULARITY`), renormalised to sum to one. This module computes that
distribution from a list of task shapes, and ships a built-in default for when a caller has none.
A policy may ask for another threshold (`NodePolicy.popularity`; fgdx-mem takes every shape).

Host memory is not part of FGD's typical pods: they are counted on shapes without it, as in the
authors' simulator, so FGD's weights are exactly theirs. Each typical shape's weight is then split
over the memory requests of the tasks of that shape, so that a memory-aware policy (fgdx-mem)
can ask whether a shape's memory fits a node; a memory-blind one sums the split back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from elastic_gpu.core.resources import MILLI_PER_CARD

#: kube-scheduler counts a container without a CPU request as 100 milli-CPU when scoring; the
#: authors' simulator computes task shapes the same way, so a zero becomes 100 here too.
DEFAULT_CPU_REQUEST = 100
#: the share of tasks FGD's typical pods cover, as in the authors' simulator
FGD_POPULARITY = 0.95


@dataclass(frozen=True, order=True)
class TaskShape:
    """What a task asks for, reduced to what fragmentation depends on."""

    cpu_milli: int
    #: per card, 0-1000; 0 for CPU-only tasks
    gpu_milli: int
    #: cards; 0 for CPU-only tasks
    gpu_count: int
    #: accepted card models; empty means any
    models: frozenset[str] = frozenset()
    #: host memory (MiB); 0 when unknown or not asked for
    memory_mib: int = 0

    @property
    def total_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI_PER_CARD

    def accepts(self, model: str) -> bool:
        return not self.models or model in self.models

    def without_memory(self) -> TaskShape:
        return TaskShape(self.cpu_milli, self.gpu_milli, self.gpu_count, self.models)


@dataclass(frozen=True)
class TargetWorkload:
    """A probability distribution over task shapes (weights sum to one)."""

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]
    #: CPU (milli) the workload asks per milli-card it asks, CPU-only tasks included: over every
    #: task it was built from (`from_counts`), else over `shapes` by `weights`; None when it asks
    #: for no GPU. With the cluster's CPU per milli-card it gives the CPU pressure
    #: (`cpu_pressure`).
    cpu_per_gpu: float | None = None

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights) or not self.shapes:
            raise ValueError("a target workload needs one weight per shape and at least one shape")
        if any(w < 0 for w in self.weights) or abs(sum(self.weights) - 1.0) > 1e-6:
            raise ValueError("target workload weights must be non-negative and sum to 1")
        if self.cpu_per_gpu is None:
            # frozen: the derived default is set once, here
            derived = _cpu_per_gpu(zip(self.shapes, self.weights, strict=True))
            object.__setattr__(self, "cpu_per_gpu", derived)
        elif self.cpu_per_gpu < 0:
            raise ValueError(f"cpu_per_gpu must be non-negative, got {self.cpu_per_gpu}")

    @cached_property
    def gpu_task_cpu_per_gpu(self) -> float | None:
        """CPU (milli) per milli-card over the GPU shapes alone, by weight: what a GPU task of
        this workload takes of a node's CPU for each milli-card it takes (fgdx-auto's balance
        target, `policies.node.FgdxAutoPolicy`); None when no shape asks for a GPU."""
        return _cpu_per_gpu((s, w) for s, w in zip(self.shapes, self.weights, strict=True)
                            if s.total_milli > 0)

    @staticmethod
    def from_tasks(tasks: Iterable[TaskShape], popularity: float = FGD_POPULARITY,
                   include_cpu_only: bool = True) -> TargetWorkload:
        """The most popular shapes covering `popularity` of the tasks, renormalised.

        Mirrors the typical-pods rule of the FGD artifact: count identical shapes (memory
        ignored), sort by count (ties: larger shape first), take shapes one by one until the
        cumulative count reaches the threshold, then renormalise. Each chosen shape's weight is
        then split over the memory requests of its tasks, in proportion to their counts.
        """
        tally: Counter[TaskShape] = Counter()
        for task in tasks:
            if include_cpu_only or task.gpu_count > 0:
                tally[task] += 1
        return TargetWorkload.from_counts(tally, popularity)

    @staticmethod
    def from_counts(tally: Mapping[TaskShape, int], popularity: float = FGD_POPULARITY
                    ) -> TargetWorkload:
        """`from_tasks` over tasks given as shape -> how many (shapes with memory; counts of
        zero or less are ignored), in time proportional to the distinct shapes, so that a
        caller keeping live counts (the extender) rebuilds cheaply."""
        if not 0.0 < popularity <= 1.0:
            raise ValueError(f"typical-pod popularity must be in (0, 1], got {popularity}")
        counts: Counter[TaskShape] = Counter()
        memories: dict[TaskShape, Counter[int]] = {}
        for task, number in tally.items():
            if number <= 0:
                continue
            shape = _normalised(task)
            counts[shape] += number
            memories.setdefault(shape, Counter())[task.memory_mib] += number
        if not counts:
            raise ValueError("cannot build a target workload from no tasks")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], _order_key(kv[0])), reverse=True)
        chosen: list[tuple[TaskShape, int]] = []
        cumulative = 0
        for shape, count in ranked:
            if cumulative >= popularity * total:
                break
            chosen.append((shape, count))
            cumulative += count
        shapes: list[TaskShape] = []
        weights: list[float] = []
        for shape, _ in chosen:
            for memory, with_memory in sorted(memories[shape].items()):
                shapes.append(TaskShape(shape.cpu_milli, shape.gpu_milli, shape.gpu_count,
                                        shape.models, memory))
                weights.append(with_memory / cumulative)
        return TargetWorkload(tuple(shapes), tuple(weights), tally_cpu_per_gpu(tally))

    @staticmethod
    def default() -> TargetWorkload:
        """A built-in mix like a production GPU-sharing cluster (see docs/simulator.md).

        Shares of a card dominate by count, one whole card is next, a few multi-card tasks and
        some CPU-only tasks; CPU and memory requests grow with the GPU request (memory as the
        built-in simulator workload has it: 2 MiB per milli-CPU plus 4, 8 or 16 GiB for a share,
        a whole card or several).
        """
        entries: Sequence[tuple[TaskShape, float]] = (
            (TaskShape(4000, 0, 0, memory_mib=8_000), 0.13),
            (TaskShape(2000, 250, 1, memory_mib=8_096), 0.08),
            (TaskShape(4000, 300, 1, memory_mib=12_096), 0.07),
            (TaskShape(6000, 500, 1, memory_mib=16_096), 0.12),
            (TaskShape(8000, 650, 1, memory_mib=20_096), 0.05),
            (TaskShape(8000, 810, 1, memory_mib=20_096), 0.06),
            (TaskShape(6000, 1000, 1, memory_mib=20_192), 0.22),
            (TaskShape(12000, 1000, 1, memory_mib=32_192), 0.18),
            (TaskShape(24000, 1000, 2, memory_mib=64_384), 0.04),
            (TaskShape(48000, 1000, 4, memory_mib=112_384), 0.03),
            (TaskShape(64000, 1000, 8, memory_mib=144_384), 0.02),
        )
        return TargetWorkload(tuple(s for s, _ in entries), tuple(w for _, w in entries))


def cpu_only_share(tally: Mapping[TaskShape, int]) -> float:
    """The share of the tasks, by count, that ask for no GPU (0 for no tasks); counts of zero or
    less are ignored, as in `TargetWorkload.from_counts`."""
    total = cpu_only = 0
    for shape, number in tally.items():
        if number > 0:
            total += number
            if shape.gpu_count == 0 or shape.gpu_milli == 0:
                cpu_only += number
    return cpu_only / total if total else 0.0


def share_of_gpu_asked(tally: Mapping[TaskShape, int]) -> float:
    """The share of the GPU the tasks ask (milli-cards, by count) that shares of one card ask
    (0 when they ask for none): 0.29 on the Alibaba default trace, 0.4-1.0 on its
    gpushare40-100 variants. Counts of zero or less are ignored."""
    shares = total = 0
    for shape, number in tally.items():
        if number > 0 and shape.gpu_count > 0 and shape.gpu_milli > 0:
            total += number * shape.total_milli
            if shape.is_share:
                shares += number * shape.total_milli
    return shares / total if total else 0.0


def tally_cpu_per_gpu(tally: Mapping[TaskShape, int]) -> float | None:
    """CPU (milli) the tasks ask per milli-card they ask (shape -> how many; counts of zero or
    less ignored): what `TargetWorkload.from_counts` records as `cpu_per_gpu`."""
    return _cpu_per_gpu((task, float(number)) for task, number in tally.items() if number > 0)


def _cpu_per_gpu(weighted: Iterable[tuple[TaskShape, float]]) -> float | None:
    """CPU (milli) asked per milli-card asked over shapes with weights (or counts)."""
    cpu = gpu = 0.0
    for shape, weight in weighted:
        cpu += weight * shape.cpu_milli
        gpu += weight * shape.total_milli
    return cpu / gpu if gpu > 0 else None


def cpu_pressure(workload_cpu_per_gpu: float | None, cluster_cpu_per_gpu: float | None
                 ) -> float | None:
    """The CPU a workload asks per GPU it asks, over the CPU the cluster's GPU nodes have per
    GPU: above 1 the CPU runs out before the GPU (docs/simulator.md, "When CPU is scarce").
    None when either side is unknown or the cluster has no CPU."""
    if workload_cpu_per_gpu is None or not cluster_cpu_per_gpu:
        return None
    return workload_cpu_per_gpu / cluster_cpu_per_gpu


def _normalised(task: TaskShape) -> TaskShape:
    """The shape FGD's typical pods count: no memory, and no CPU request counts as 100."""
    shape = task.without_memory()
    return shape if shape.cpu_milli > 0 else replace(shape, cpu_milli=DEFAULT_CPU_REQUEST)


def _order_key(shape: TaskShape) -> tuple[int, int, int, tuple[str, ...]]:
    return (shape.cpu_milli, shape.gpu_milli, shape.gpu_count, tuple(sorted(shape.models)))
