"""Experimental fgdx variants that did not win, kept so their figures can be re-measured.

Usage: python bench/sim_variants.py POLICY[/CARD],... WORKLOAD,... SEEDS [--out results.json]
e.g.   python bench/sim_variants.py fgdx,fgdx/frag-exact,x_few gpushare60,gpushare80 42-46
Prints the median unallocated GPU % at 100% arrived and the per-seed values. The variants are
registered here, not in the engine (docs/benchmarks.md, "fgdx-cpufit" and "Third attempt",
and docs/simulator.md list the results), and so is the `fgd-tight` card tier.
Note: `auto` maps only fgd/fgdx to the fgd card tier; the x_* variants get binpack under auto.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from elastic_gpu.core.frag import sigmoid, sorted_free
from elastic_gpu.core.policies import (
    CardView,
    NodeView,
    ScoreContext,
    register_card_policy,
    register_node_policy,
)
from elastic_gpu.core.policies.base import CardPolicy
from elastic_gpu.core.policies.node import (
    MAX_SCORE,
    MAX_SPEC_GPU,
    BestFitPolicy,
    DotProductPolicy,
    FgdxPolicy,
    free_after,
)
from elastic_gpu.core.workload import TaskShape
from elastic_gpu.sim.compare import Job, parse_seeds, run_jobs

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))


def _is_gpu(task: TaskShape) -> bool:
    return task.gpu_count > 0 and task.gpu_milli > 0


class FewerGpus(FgdxPolicy):
    """fgdx; GPU tasks also prefer, among FGD ties, nodes with fewer cards."""

    name = "x_few"

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        return base - 1e-3 * node.gpu_count / 8 if _is_gpu(task) else base


class CpuRich(FgdxPolicy):
    """fgdx; GPU tasks also prefer, among FGD ties, the most CPU left per idle GPU."""

    name = "x_cpurich"

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        if not _is_gpu(task):
            return base
        gpu_left = node.free_total - task.total_milli
        cpu_left = node.cpu_free - task.cpu_milli
        return base + 1e-4 * min(cpu_left / max(gpu_left, 1) / 128, 1.0)


class ExactGrowth(FgdxPolicy):
    """fgdx; CPU-only tasks ordered by their exact fragmentation growth plus idle GPU."""

    name = "x_exact"

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        if _is_gpu(task):
            return base
        free = sorted_free(node.free)
        before = ctx.frag.node(node.model, node.cpu_free, free)
        after = ctx.frag.node(node.model, node.cpu_free - task.cpu_milli, free)
        return base - 1e-3 * min((after - before) / 8000, 1.0) - 1e-5 * node.free_total / MAX_SPEC_GPU


class GpuBinpack(FgdxPolicy):
    """fgdx; GPU tasks also prefer, among FGD ties, the node left with the least free GPU."""

    name = "x_gbp"

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        if not _is_gpu(task):
            return base
        return base - 1e-3 * (node.free_total - task.total_milli) / MAX_SPEC_GPU


class BlendBestFit(FgdxPolicy):
    """fgdx plus a small share of bestfit's score (0.02 x 0..100: up to 2 FGD points)."""

    name = "x_bf"
    alpha = 0.02

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        if not _is_gpu(task):
            return base
        return base + self.alpha * BestFitPolicy().score(ctx, task, node)


class BlendBestFit5(BlendBestFit):
    name = "x_bf5"
    alpha = 0.05


class BlendDotProd(FgdxPolicy):
    """fgdx plus a small share of dotprod's score."""

    name = "x_dp"
    alpha = 0.02

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        if not _is_gpu(task):
            return base
        return base + self.alpha * DotProductPolicy().score(ctx, task, node)


class ShareTight(FgdxPolicy):
    """fgdx; a share also prefers, among FGD ties, the node whose best card it fills tightest
    (least compute left on that card); whole-card and CPU-only tasks as fgdx."""

    name = "x_stight"

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        base = super().score(ctx, task, node)
        if not task.is_share:
            return base
        left = min(f for f in node.free if f >= task.gpu_milli) - task.gpu_milli
        return base - 1e-3 * left / 1000


class FinerSigmoid(FgdxPolicy):
    """fgdx with FGD's sigmoid twice as steep for GPU tasks (Delta/500): fewer integer ties."""

    name = "x_sig500"
    scale = 500.0

    def score(self, ctx: ScoreContext, task: TaskShape, node: NodeView) -> float:
        if not _is_gpu(task):
            return super().score(ctx, task, node)
        before = ctx.frag.node(node.model, node.cpu_free, sorted_free(node.free))
        cpu_after = node.cpu_free - task.cpu_milli
        best = 0.0
        for _, free in free_after(task, node.free):
            after = ctx.frag.node(node.model, cpu_after, sorted_free(free))
            best = max(best, float(int(sigmoid((before - after) / self.scale) * MAX_SCORE)))
        return best


class FragCardsTight(CardPolicy):
    """FGD's card rule (integer sigmoid score), ties by the tightest fit instead of lowest index."""

    name = "fgd-tight"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        node = view.node
        cpu_after = node.cpu_free - view.task.cpu_milli
        before = ctx.frag.node(node.model, node.cpu_free, sorted_free(view.free_milli))

        def key(pos: int) -> tuple[int, int, int]:
            free = list(view.free_milli)
            free[pos] -= milli
            after = ctx.frag.node(node.model, cpu_after, sorted_free(free))
            return (-int(sigmoid((before - after) / 1000) * 100), view.free_milli[pos],
                    view.cards[pos].index)

        return min(candidates, key=key)


for _cls in (FewerGpus, CpuRich, ExactGrowth, GpuBinpack, BlendBestFit, BlendBestFit5,
             BlendDotProd, ShareTight, FinerSigmoid):
    register_node_policy(_cls)
register_card_policy(FragCardsTight)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", help="policy[/card],...")
    parser.add_argument("workloads")
    parser.add_argument("seeds")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    nodes = str(DATA / "openb_node_list_all_node.csv")
    jobs = []
    for spec in args.specs.split(","):
        policy, _, card = spec.partition("/")
        for workload in args.workloads.split(","):
            for seed in parse_seeds(args.seeds):
                jobs.append(Job(workload, nodes, str(DATA / f"openb_pod_list_{workload}.csv"), policy,
                                seed, 1.3, card or "auto"))
    started = time.perf_counter()
    outcomes = run_jobs(jobs, args.processes)
    results: dict[str, list[tuple[int, float]]] = {}
    for o in outcomes:
        key = f"{o.job.policy}/{o.job.card_policy} {o.job.workload}"
        results.setdefault(key, []).append((o.job.seed, round(o.unallocated_100, 3)))
    for key, values in sorted(results.items()):
        values.sort()
        print(f"{key}: median {statistics.median(v for _, v in values):.2f} {[v for _, v in values]}")
    print(f"{len(jobs)} replays in {time.perf_counter() - started:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
