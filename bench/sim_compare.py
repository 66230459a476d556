"""Median unallocated GPU % at 100% arrived, ours beside the FGD authors' reference.

Usage: python bench/sim_compare.py [--workloads default,gpushare40,...] [--policies ...]
       [--seeds 42-51] [--processes 2] [--out results.json] [--popularity 0.95]
Runs `egpu simulate --compare` logic for every workload and prints one Markdown table
(workload x policy: ours, reference, difference); docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from elastic_gpu.sim.compare import Job, load_reference, medians, parse_seeds, run_jobs

DATA = Path(os.environ.get("EGPU_TRACE_DIR", "/work/shared/data/alibaba-gpu-2023"))
REFERENCE = Path(os.environ.get("EGPU_REFERENCE_DIR", "/work/shared/data/fgd-reference"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="default")
    parser.add_argument("--policies", default="random,dotprod,clustering,packing,bestfit,fgd,fgdx")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--card-policy", default="auto",
                        help="card tier for every policy; auto: the artifact's pairing")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--popularity", type=float,
                        help="typical pods' share of the tasks; default: each policy's")
    args = parser.parse_args()
    nodes = str(DATA / "openb_node_list_all_node.csv")
    policies = args.policies.split(",")
    jobs = [Job(f"openb_pod_list_{w}", nodes, str(DATA / f"openb_pod_list_{w}.csv"), p, s, 1.3,
                args.card_policy, args.popularity)
            for w in args.workloads.split(",") for p in policies for s in parse_seeds(args.seeds)]
    started = time.perf_counter()
    outcomes = run_jobs(jobs, args.processes)
    elapsed = time.perf_counter() - started
    reference = load_reference(REFERENCE)
    table = medians(outcomes)
    print(f"{len(jobs)} replays in {elapsed:.0f} s with {args.processes} processes; seeds {args.seeds}")
    print("| workload | policy | ours | reference | ours - ref |")
    print("|---|---|---:|---:|---:|")
    for (workload, policy), (median, _) in sorted(table.items(),
                                                   key=lambda kv: (kv[0][0], policies.index(kv[0][1]))):
        ref = reference.get((workload, policy))
        # three decimals: per-seed figures have two, so a median of ten can end in 5
        ref_text = f"{ref:.3f}" if ref is not None else "-"
        diff = f"{median - ref:+.3f}" if ref is not None else "-"
        name = workload.removeprefix("openb_pod_list_")
        print(f"| {name} | {policy} | {median:.3f} | {ref_text} | {diff} |")
    if args.out:
        args.out.write_text(json.dumps([{"workload": o.job.workload, "policy": o.job.policy,
                                         "seed": o.job.seed, "unallocated_100": o.unallocated_100}
                                        for o in outcomes], indent=1))


if __name__ == "__main__":
    main()
