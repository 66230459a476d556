"""Many replays (policies x seeds x workloads) and their medians, beside the FGD reference."""

from __future__ import annotations

import csv
import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from elastic_gpu.core.model import Node
from elastic_gpu.sim.builtin import builtin_nodes, builtin_tasks
from elastic_gpu.sim.replay import replay
from elastic_gpu.sim.trace import Task, load_nodes, load_tasks, with_multi_shares

#: our policy name -> the reference's sc_policy column
REFERENCE_NAMES = {
    "random": "01-Random", "dotprod": "02-DotProd", "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking", "bestfit": "05-BestFit", "fgd": "06-FGD",
}


@dataclass(frozen=True)
class Job:
    workload: str  # "builtin" or a pod-list file name stem
    nodes_path: str | None
    pods_path: str | None
    policy: str
    seed: int
    inflation: float
    card_policy: str
    popularity: float | None = None  # typical pods' share of tasks; None: the policy's
    #: CPU-heavy variants made in code from a trace (bench/sim_variants.py): every task's CPU
    #: request, and every node's CPU capacity, multiplied by these
    task_cpu_scale: float = 1.0
    node_cpu_scale: float = 1.0
    #: > 0: CPU-only tasks of the trace repeated (renamed copies, in name order) until they are
    #: this share of the tasks by count, as the FGD authors' cpu* traces vary it
    cpu_only_share: float = 0.0
    #: defragmentation's move budget per task that fails to place (0: none; `replay`)
    defrag_moves: int = 0
    #: CPU-only tasks movable too
    defrag_cpu_tasks: bool = False
    #: > 0: this share of the one-card share tasks asks its share on `multi_share_cards`
    #: distinct cards (`trace.with_multi_shares`)
    multi_share_fraction: float = 0.0
    multi_share_cards: int = 2

    @property
    def label(self) -> str:
        """The policy, and the move budget when there is one: what medians group by."""
        if self.defrag_moves <= 0:
            return self.policy
        return f"{self.policy} k={self.defrag_moves}{'+cpu' if self.defrag_cpu_tasks else ''}"


@dataclass(frozen=True)
class Outcome:
    job: Job
    unallocated_100: float
    summary: dict[str, object]


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `42,43` or `42` -> list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            if int(hi) < int(lo):
                raise ValueError(f"seed range {part!r} runs backwards")
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return seeds


def scale_cpu(nodes: Sequence[Node], tasks: Sequence[Task], task_scale: float,
              node_scale: float) -> tuple[list[Node], list[Task]]:
    """A CPU-heavier copy of a trace: task CPU requests x task_scale, node CPU x node_scale
    (rounded to whole milli-CPUs)."""
    if task_scale <= 0 or node_scale <= 0:
        raise ValueError(f"CPU scales must be positive, got task {task_scale}, node {node_scale}")
    return ([dataclasses.replace(n, cpu_milli=round(n.cpu_milli * node_scale)) for n in nodes],
            [dataclasses.replace(t, cpu_milli=round(t.cpu_milli * task_scale)) for t in tasks])


def more_cpu_only(tasks: Sequence[Task], share: float) -> list[Task]:
    """The trace with its CPU-only tasks repeated (copies named `<name>+<k>`, drawn in name
    order, round robin) until they are `share` of the tasks by count."""
    if not 0 < share < 1:
        raise ValueError(f"CPU-only share must be in (0, 1), got {share}")
    cpu_only = sorted((t for t in tasks if t.total_milli == 0), key=lambda t: t.name)
    if not cpu_only:
        raise ValueError("the trace has no CPU-only task to repeat")
    extra = max(0, round((share * len(tasks) - len(cpu_only)) / (1 - share)))
    return [*tasks, *(cpu_only[k % len(cpu_only)].renamed(f"{cpu_only[k % len(cpu_only)].name}+{k}")
                      for k in range(extra))]


def run_job(job: Job) -> Outcome:
    if job.pods_path is None:
        nodes, tasks = builtin_nodes(), builtin_tasks()
    else:
        assert job.nodes_path is not None
        nodes, tasks = load_nodes(Path(job.nodes_path)), load_tasks(Path(job.pods_path))
    if job.task_cpu_scale != 1.0 or job.node_cpu_scale != 1.0:
        nodes, tasks = scale_cpu(nodes, tasks, job.task_cpu_scale, job.node_cpu_scale)
    if job.cpu_only_share > 0:
        tasks = more_cpu_only(tasks, job.cpu_only_share)
    if job.multi_share_fraction > 0:
        tasks = with_multi_shares(tasks, job.multi_share_fraction, job.multi_share_cards)
    result = replay(nodes, tasks, job.policy, seed=job.seed, inflation=job.inflation,
                    card_policy=job.card_policy, popularity=job.popularity,
                    defrag_moves=job.defrag_moves, defrag_cpu_tasks=job.defrag_cpu_tasks)
    summary = result.summary()
    unallocated = summary["unallocated"]
    assert isinstance(unallocated, dict)
    return Outcome(job, float(unallocated.get("100", float("nan"))), summary)


def run_jobs(jobs: Sequence[Job], processes: int = 2,
             done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    outcomes: list[Outcome] = []
    if processes <= 1:
        for job in jobs:
            outcome = run_job(job)
            outcomes.append(outcome)
            if done:
                done(outcome)
        return outcomes
    with ProcessPoolExecutor(max_workers=processes) as pool:
        for outcome in pool.map(run_job, jobs):
            outcomes.append(outcome)
            if done:
                done(outcome)
    return outcomes


def medians(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], tuple[float, int]]:
    """(workload, policy) -> (median unallocated % at 100% arrived, number of runs); with a
    move budget the policy reads `<policy> k=<K>` (`Job.label`)."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for o in outcomes:
        groups[(o.job.workload, o.job.label)].append(o.unallocated_100)
    return {k: (statistics.median(v), len(v)) for k, v in groups.items()}


def move_medians(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], tuple[float, float]]:
    """(workload, `Job.label`) -> median moves as % of tasks, over the whole replay and up to
    100% arrived, for the replays with a move budget."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for o in outcomes:
        defrag = o.summary.get("defrag")
        if not isinstance(defrag, dict):
            continue
        tasks = o.summary["tasks"]
        assert isinstance(tasks, int)
        groups[(o.job.workload, o.job.label)].append(
            (100 * defrag["moves"] / tasks, 100 * defrag["moves_to_100"] / tasks))
    return {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
            for k, v in groups.items()}


def load_reference(directory: Path) -> dict[tuple[str, str], float]:
    """(workload, our policy name) -> the authors' median unallocated % at 100% arrived."""
    path = directory / "analysis_allo_discrete.csv"
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise ValueError(f"{path}: cannot open ({err.strerror})") from None
    ours = {v: k for k, v in REFERENCE_NAMES.items()}
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    with handle:
        for row in csv.DictReader(handle):
            policy = ours.get(row.get("sc_policy", ""))
            if policy is None or not row.get("100"):
                continue
            groups[(row["workload"], policy)].append(100.0 - float(row["100"]))
    return {k: statistics.median(v) for k, v in groups.items()}
