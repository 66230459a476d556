"""Where the unallocated GPU sits at 100% arrived: one replay, stopped there, taken apart.

Usage: python bench/sim_leftovers.py WORKLOAD POLICY CARD SEED [--cpu-scale N] [--memory-scale N]
e.g.   python bench/sim_leftovers.py gpushare60 fgdx fgd 42
Prints the unallocated % at 100% arrived (the last arrival whose cumulative request is within
capacity, so it may differ by a few hundredths from the binned figure of `egpu simulate`), the
failed tasks by kind (cpu / share / <n>g) and first failing check, and the idle compute grouped
by the exact free compute of each card. `--cpu-scale 10` gives every node ten times its CPU: the
difference to a normal run bounds what any CPU-aware rule could win on that replay;
`--memory-scale 10` does the same for host memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections import Counter
from pathlib import Path

from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.workload import TargetWorkload, TaskShape
from elastic_gpu.sim.replay import arrival_order
from elastic_gpu.sim.trace import load_nodes, load_tasks

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))


def kind(shape: TaskShape) -> str:
    if shape.total_milli == 0:
        return "cpu"
    return "share" if shape.is_share else f"{shape.gpu_count}g"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("policy")
    parser.add_argument("card")
    parser.add_argument("seed", type=int)
    parser.add_argument("--cpu-scale", type=int, default=1)
    parser.add_argument("--memory-scale", type=int, default=1)
    args = parser.parse_args()
    nodes = [n for n in load_nodes(DATA / "openb_node_list_all_node.csv") if n.cards]
    if args.cpu_scale != 1:
        nodes = [dataclasses.replace(n, cpu_milli=n.cpu_milli * args.cpu_scale) for n in nodes]
    if args.memory_scale != 1:
        nodes = [dataclasses.replace(n, memory_mib=n.memory_mib * args.memory_scale) for n in nodes]
    tasks = load_tasks(DATA / f"openb_pod_list_{args.workload}.csv")
    capacity = sum(len(n.cards) for n in nodes) * 1000
    # the target workload comes from the unscaled tasks, as in a replay
    workload = TargetWorkload.from_tasks(t.shape() for t in tasks)
    engine = Engine(nodes, PolicyConfig(node_policy=args.policy, card_policy=args.card),
                    seed=args.seed, workload=workload)
    arrived = used = 0
    failed: Counter[tuple[str, str]] = Counter()
    for task in arrival_order(tasks, capacity, 1.3, args.seed):
        if arrived + task.total_milli > capacity:
            break
        arrived += task.total_milli
        pod = task.request()
        try:
            assignment = engine.place(pod)
        except Unschedulable as err:
            failed[(kind(task.shape()), err.category)] += 1
            continue
        engine.allocate(pod.key, assignment, pod)
        used += task.total_milli
    print(f"unallocated at {100 * arrived / capacity:.2f}% arrived: "
          f"{100 * (arrived - used) / capacity:.2f}% of capacity")
    print("failed (kind, check): " + ", ".join(f"{k[0]}/{k[1]} {v}" for k, v in failed.most_common()))
    by_free: Counter[int] = Counter()
    for node in nodes:
        for left in engine.node_view(node.name).free:
            if left:
                by_free[left] += 1
    idle = sum(k * v for k, v in by_free.items())
    print(f"idle: {idle / 1000:.0f} cards' worth on {sum(by_free.values())} cards")
    for left, cards in sorted(by_free.items(), key=lambda kv: -kv[0] * kv[1])[:12]:
        print(f"  {left:4d} milli free on {cards:5d} cards = {left * cards / 1000:6.1f} cards "
              f"({100 * left * cards / capacity:.2f}% of capacity)")


if __name__ == "__main__":
    main()
