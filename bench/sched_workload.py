"""Cost of one rebuild of the extender's observed target workload (`targetWorkload: observed`).

Usage: python bench/sched_workload.py [--pods 1000 10000 50000] [--repeat 7]
The live pods are task shapes drawn from the Alibaba default trace (cycled to the count); one
rebuild is what `SchedulerState` does after `workloadRefreshPods` pods came or went:
`TargetWorkload.from_counts` over the live count of each distinct shape (which the state keeps
up to date as pods come and go), then `Engine.set_workload` (new fragmentation model; the score
caches are dropped). The `from_tasks` column is the same from the list of every pod, for
comparison. Prints a Markdown table, median of N.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time
from collections import Counter
from pathlib import Path

from elastic_gpu.core.placement import Engine
from elastic_gpu.core.workload import TargetWorkload
from elastic_gpu.sim.trace import load_tasks

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, nargs="+", default=[1000, 10_000, 50_000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    shapes = [t.shape() for t in load_tasks(DATA / "openb_pod_list_default.csv")]
    engine = Engine([])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores")
    print("| live pods | distinct shapes | typical shapes | rebuild ms (median) | from_tasks ms |")
    print("|---:|---:|---:|---:|---:|")
    for count in args.pods:
        live = list(itertools.islice(itertools.cycle(shapes), count))
        tally = Counter(live)
        times, full = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            workload = TargetWorkload.from_counts(tally)
            engine.set_workload(workload)
            times.append(time.perf_counter() - started)
            started = time.perf_counter()
            TargetWorkload.from_tasks(live)
            full.append(time.perf_counter() - started)
        print(f"| {count} | {len(tally)} | {len(workload.shapes)} | "
              f"{statistics.median(times) * 1000:.1f} | {statistics.median(full) * 1000:.1f} |")


if __name__ == "__main__":
    main()
