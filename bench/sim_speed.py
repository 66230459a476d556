"""Wall time of one replay of the Alibaba default trace at 1.3x, per policy (median of N).

Usage: python bench/sim_speed.py [--data DIR] [--policies fgd,...] [--repeat 3]
Prints a Markdown table; docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from elastic_gpu.sim.replay import replay
from elastic_gpu.sim.trace import load_nodes, load_tasks

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--pods", default="openb_pod_list_default.csv")
    parser.add_argument("--policies", default="fgd")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    started = time.perf_counter()
    nodes = load_nodes(args.data / "openb_node_list_all_node.csv")
    tasks = load_tasks(args.data / args.pods)
    load_s = time.perf_counter() - started
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"trace load {load_s:.2f} s")
    print("| policy | arrivals | wall s (median) | runs |")
    print("|---|---:|---:|---:|")
    for policy in args.policies.split(","):
        walls = []
        tasks_n = 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = replay(nodes, tasks, policy, seed=args.seed)
            walls.append(time.perf_counter() - t0)
            tasks_n = result.tasks
        print(f"| {policy} | {tasks_n} | {statistics.median(walls):.2f} | {args.repeat} |")


if __name__ == "__main__":
    main()
