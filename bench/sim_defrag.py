"""Defragmentation in the simulator: unallocated GPU % at 100% arrived and moves, per move
budget K, beside K = 0 (today's replay) in the same run.

Usage: python bench/sim_defrag.py run OUT.jsonl [--workloads default,gpushare40,...|nine]
           [--budgets 0,1,2,4] [--seeds 42-51] [--policy fgdx-auto]
       python bench/sim_defrag.py table OUT.jsonl
       python bench/sim_defrag.py speed - [--workloads default] [--budgets 2] [--seeds 42]
       python bench/sim_defrag.py bound - [--workloads nine] [--seeds 42-51]
`run` replays every (workload, seed, K) in one process, in that order (so a cut-short run has
every K of the seeds it reached), appending one JSON line per replay; it skips replays already
in OUT, so the same command resumes. `table` prints the Markdown table docs/benchmarks.md
quotes: per workload and K, the median unallocated % at 100% arrived, its change from K = 0,
the median moves as % of tasks (over the whole replay at 1.3x, and up to 100% arrived), tasks
placed by a plan up to 100% arrived, and the mean wall seconds of one replay (on a busy box a
ratio between rows of one run is what the numbers say). `speed` times every call of the planner
in one replay per (workload, seed, K): calls, and the median, 90th percentile and largest
milliseconds of one call, found or not. `bound` needs no replay: a floor under the unallocated
% at 100% arrived that holds for any placement, moves or not (`bound`'s docstring). Run it
with low priority (`nice -n 10`): the replays are CPU-heavy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from elastic_gpu.sim.compare import Job, parse_seeds, run_job

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))
#: the project's nine shared workloads (bench/sim_variants.py's `nine`)
NINE = ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100", "multigpu20",
        "multigpu30", "multigpu40", "multigpu50")


def run(out: Path, workloads: list[str], budgets: list[int], seeds: list[int], policy: str) -> None:
    done = {(r["workload"], r["seed"], r["k"]) for r in read(out)}
    nodes = str(DATA / "openb_node_list_all_node.csv")
    with out.open("a") as handle:
        for workload in workloads:
            for seed in seeds:
                for k in budgets:
                    if (workload, seed, k) in done:
                        continue
                    job = Job(workload, nodes, str(DATA / f"openb_pod_list_{workload}.csv"),
                              policy, seed, 1.3, "auto", defrag_moves=k)
                    outcome = run_job(job)
                    s = outcome.summary
                    defrag = s.get("defrag") or {}
                    assert isinstance(defrag, dict)
                    unallocated = s["unallocated"]
                    assert isinstance(unallocated, dict)
                    row = {"workload": workload, "seed": seed, "k": k, "policy": policy,
                           "unallocated_100": outcome.unallocated_100,
                           "unallocated_130": unallocated.get("130"), "tasks": s["tasks"],
                           "moves": defrag.get("moves", 0),
                           "moves_to_100": defrag.get("moves_to_100", 0),
                           "rescued": defrag.get("rescued", 0),
                           "rescued_to_100": defrag.get("rescued_to_100", 0),
                           "failed_to_100": s["failed_to_100"], "wall_seconds": s["wall_seconds"]}
                    handle.write(json.dumps(row) + "\n")
                    handle.flush()
                    print(json.dumps(row), flush=True)


def speed(workloads: list[str], budgets: list[int], seeds: list[int], policy: str) -> None:
    from elastic_gpu.sim import replay as replay_module
    from elastic_gpu.sim.trace import load_nodes, load_tasks

    planner = replay_module.__dict__["plan_moves"]
    timings: list[tuple[float, bool]] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        found = planner(*args, **kwargs)
        timings.append((time.perf_counter() - started, found is not None))
        return found

    setattr(replay_module, "plan_moves", timed)  # noqa: B010 (the replay's own reference)
    nodes = load_nodes(DATA / "openb_node_list_all_node.csv")
    print("| workload | seed | K | calls | found | median ms | p90 ms | max ms | replay s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workload in workloads:
        tasks = load_tasks(DATA / f"openb_pod_list_{workload}.csv")
        for seed in seeds:
            for k in budgets:
                timings.clear()
                result = replay_module.replay(nodes, tasks, policy, seed=seed, defrag_moves=k)
                ms = sorted(1000 * t for t, _ in timings) or [0.0]
                p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
                print(f"| {workload} | {seed} | {k} | {len(timings)} | "
                      f"{sum(f for _, f in timings)} | {statistics.median(ms):.1f} | {p90:.1f} | "
                      f"{ms[-1]:.1f} | {result.wall_seconds:.1f} |", flush=True)


def bound(workloads: list[str], seeds: list[int]) -> None:
    """The trace's most common share, 0.81 of a card, leaves 0.19 that only shares of at most
    0.19 can use. Of the tasks arrived by 100% (in the replay's order), let n be the 0.81
    shares and S the compute of the shares of at most 0.19: any placement that turns d of the
    0.81 shares away leaves at least max(810 d, 190 (n - d) - S) milli-cards of the arrived
    request unallocated (at 100% arrived, arrived = capacity, so idle = unallocated). The
    floor is the least of that over d, as % of capacity; CPU, memory and every other share
    size are ignored, so the true floor is higher."""
    from elastic_gpu.sim.replay import arrival_order
    from elastic_gpu.sim.trace import load_nodes, load_tasks

    nodes = [n for n in load_nodes(DATA / "openb_node_list_all_node.csv") if n.cards]
    capacity = sum(len(n.cards) for n in nodes) * 1000
    print("| workload | seeds | 0.81 shares by 100% (median) | floor % of capacity (median) |")
    print("|---|---|---:|---:|")
    for workload in workloads:
        tasks = load_tasks(DATA / f"openb_pod_list_{workload}.csv")
        counts: list[int] = []
        floors: list[float] = []
        for seed in seeds:
            total = big = small = 0
            for t in arrival_order(tasks, capacity, 1.3, seed):
                if total + t.total_milli > capacity:
                    break
                total += t.total_milli
                if t.num_gpu == 1 and t.gpu_milli == 810:
                    big += 1
                elif t.num_gpu == 1 and 0 < t.gpu_milli <= 190:
                    small += t.gpu_milli
            floor = min(max(810 * d, 190 * (big - d) - small) for d in range(big + 1))
            counts.append(big)
            floors.append(100 * floor / capacity)
        print(f"| {workload} | {seeds[0]}-{seeds[-1]} | {statistics.median(counts):g} | "
              f"{statistics.median(floors):.2f} |")


def read(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(path: Path) -> None:
    groups: dict[tuple[str, int], list[dict[str, object]]] = defaultdict(list)
    for r in read(path):
        groups[(str(r["workload"]), int(str(r["k"])))].append(r)
    order = {w: i for i, w in enumerate(NINE)}
    print("| workload | K | runs (seeds) | unallocated % at 100% | vs K=0 | moves % of tasks "
          "(to 100%) | placed by a plan to 100% | wall s / replay |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    for (workload, k), rows in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99),
                                                                       kv[0][0], kv[0][1])):
        seeds = sorted(int(str(r["seed"])) for r in rows)
        median = statistics.median(float(str(r["unallocated_100"])) for r in rows)
        if k == 0:
            base[workload] = median
        # the K=0 median over the same seeds: a change is read on equal ground
        same = [float(str(r["unallocated_100"])) for r in groups.get((workload, 0), [])
                if int(str(r["seed"])) in seeds]
        change = (f"{median - statistics.median(same):+.3f}"
                  if k and len(same) == len(seeds) else "-")
        moves = statistics.median(100 * float(str(r["moves"])) / float(str(r["tasks"])) for r in rows)
        moves_100 = statistics.median(100 * float(str(r["moves_to_100"])) / float(str(r["tasks"]))
                                      for r in rows)
        rescued = statistics.median(float(str(r["rescued_to_100"])) for r in rows)
        wall = statistics.mean(float(str(r["wall_seconds"])) for r in rows)
        span = f"{len(rows)} ({seeds[0]}-{seeds[-1]})" if len(seeds) > 1 else f"1 ({seeds[0]})"
        print(f"| {workload} | {k} | {span} | {median:.3f} | {change} | {moves:.3f} "
              f"({moves_100:.3f}) | {rescued:g} | {wall:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "table", "speed", "bound"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--workloads", default="default")
    parser.add_argument("--budgets", default="0,1,2,4")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--policy", default="fgdx-auto")
    args = parser.parse_args()
    if args.command == "table":
        table(args.out)
        return
    workloads = list(NINE) if args.workloads == "nine" else args.workloads.split(",")
    budgets = [int(k) for k in args.budgets.split(",")]
    if args.command == "bound":
        bound(workloads, parse_seeds(args.seeds))
        return
    if args.command == "speed":
        speed(workloads, budgets, parse_seeds(args.seeds), args.policy)
        return
    run(args.out, workloads, budgets, parse_seeds(args.seeds), args.policy)


if __name__ == "__main__":
    main()
