"""fgdx with host memory in FGD's fragmentation: an experiment, not an engine policy (yet).

Usage: python bench/sim_memory.py WORKLOAD SEEDS [--card fgd-waste] [--processes 2]
e.g.   python bench/sim_memory.py multigpu50 42-51
Prints the median unallocated GPU % at 100% arrived of `x_mem` and the per-seed values.

FGD asks, per task shape of the target workload, whether the shape fits a node: cards and CPU.
Host memory is not in the test (nor in the authors' simulator), yet the trace's tasks ask for
about 48 GiB of memory per card they use, exactly what a G2 node has per card, and an 8-card
task asks for about 330 GiB of a G2's 384 GiB. `x_mem` is fgdx whose FGD test for GPU tasks also
requires the shape's memory to fit; FGD's typical pods and their weights are unchanged, each
split over the memory requests of the trace tasks of that shape. docs/simulator.md ("Host
memory") has the results and why this is not yet the engine's fgdx.

It needs each task's memory in its shape, which the engine's TaskShape does not carry: the
script wraps `engine.task_shape` to add it (in this process only) and reads the workload's
memory requests from the trace itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import elastic_gpu.core.engine as engine_module
from elastic_gpu.core.frag import sigmoid, sorted_free
from elastic_gpu.core.policies import NodeView, ScoreContext, register_node_policy
from elastic_gpu.core.policies.node import MAX_SCORE, FgdxPolicy, free_after
from elastic_gpu.core.workload import DEFAULT_CPU_REQUEST, TargetWorkload, TaskShape
from elastic_gpu.sim.compare import Job, parse_seeds, run_jobs
from elastic_gpu.sim.trace import load_tasks

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))


@dataclass(frozen=True, order=True)
class MemoryShape(TaskShape):
    memory_mib: int = 0


_plain_task_shape = engine_module.task_shape


def _task_shape_with_memory(pod: engine_module.PodRequest) -> TaskShape:
    shape = _plain_task_shape(pod)
    return MemoryShape(shape.cpu_milli, shape.gpu_milli, shape.gpu_count, shape.models,
                       pod.memory_mib)


engine_module.task_shape = _task_shape_with_memory

#: (cpu, memory, milli per card, cards, models) -> weight; set from the workload in main()
_Typical = list[tuple[tuple[int, int, int, int, frozenset[str]], float]]
_TYPICAL: _Typical = []


def typical_with_memory(pods_csv: Path) -> _Typical:
    """FGD's typical pods and weights, each split over its tasks' memory requests."""
    tasks = load_tasks(pods_csv)
    workload = TargetWorkload.from_tasks(t.shape() for t in tasks)
    memories: dict[TaskShape, Counter[int]] = {}
    for task in tasks:
        shape = task.shape()
        key = TaskShape(max(shape.cpu_milli, DEFAULT_CPU_REQUEST), shape.gpu_milli, shape.gpu_count,
                        shape.models)
        memories.setdefault(key, Counter())[task.memory_mib] += 1
    out: _Typical = []
    for shape, weight in zip(workload.shapes, workload.weights, strict=True):
        counts = memories[shape]
        total = sum(counts.values())
        for memory, count in counts.items():
            out.append(((max(shape.cpu_milli, DEFAULT_CPU_REQUEST), memory, shape.gpu_milli,
                         shape.gpu_count, shape.models), weight * count / total))
    return out


_MEMO: dict[tuple[str, int, int, tuple[int, ...]], float] = {}


def fragmentation(model: str, cpu_free: int, memory_free: int, free: tuple[int, ...]) -> float:
    """FGD's expected fragment (milli-cards) with memory in the fit test; `free` descending."""
    key = (model, cpu_free, memory_free, free)
    value = _MEMO.get(key)
    if value is not None:
        return value
    total = sum(free)
    fit_weight = small_weight = 0.0
    if total:
        for (cpu, memory, milli, count, models), weight in _TYPICAL:
            if count == 0 or milli == 0 or (models and model not in models):
                continue
            if len(free) < count or free[count - 1] < milli or cpu > cpu_free or memory > memory_free:
                continue
            small = 0
            for left in reversed(free):
                if left >= milli:
                    break
                small += left
            fit_weight += weight
            small_weight += weight * small
    value = total * (1.0 - fit_weight) + small_weight if total else 0.0
    if len(_MEMO) > 3_000_000:
        _MEMO.clear()
    _MEMO[key] = value
    return value


class FgdxMemory(FgdxPolicy):
    """fgdx; GPU tasks are scored by FGD with memory in the fit test."""

    name = "x_mem"

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        if task.gpu_count == 0 or task.gpu_milli == 0:
            return super().score(ctx, task, node)
        memory = task.memory_mib if isinstance(task, MemoryShape) else 0
        before = fragmentation(node.model, node.cpu_free, node.memory_free, sorted_free(node.free))
        cpu_after, memory_after = node.cpu_free - task.cpu_milli, node.memory_free - memory
        best: int | None = None
        for _, free in free_after(task, node.free):
            after = fragmentation(node.model, cpu_after, memory_after, sorted_free(free))
            value = int(sigmoid((before - after) / 1000) * MAX_SCORE)
            best = value if best is None or value > best else best
        return float(best) if best is not None else 0.0


register_node_policy(FgdxMemory)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("seeds")
    parser.add_argument("--card", default="fgd-waste")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    pods = DATA / f"openb_pod_list_{args.workload}.csv"
    # set before the worker processes fork, so that they inherit it
    _TYPICAL.extend(typical_with_memory(pods))
    jobs = [Job(args.workload, str(DATA / "openb_node_list_all_node.csv"), str(pods), "x_mem",
                seed, 1.3, args.card) for seed in parse_seeds(args.seeds)]
    values = sorted((o.job.seed, o.unallocated_100) for o in run_jobs(jobs, args.processes))
    median = statistics.median(v for _, v in values)
    print(f"x_mem/{args.card} {args.workload}: median {median:.3f} {[v for _, v in values]}")


if __name__ == "__main__":
    main()
