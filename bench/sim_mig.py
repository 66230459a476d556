"""Dynamic MIG in the simulator (issue 42): static layouts against the planner, on the MIG mix
of `egpu simulate --mig-mix` (sim/migmix.py), per model and seed.

Usage: python bench/sim_mig.py [--models A100-SXM4-80GB,H100-80GB,...] [--seeds 42-44]
           [--mix nodes=16,gpus=8,tasks=4000,load=0.85] [--json OUT.json]
The tasks are the built-in workload's single-card tasks (shares as HAMi `vgpu-mode: mig`
profiles, whole cards) and the synthetic profile mix. Prints the Markdown table
docs/benchmarks.md quotes: per model and layouts, the mean over the seeds of MIG tasks served
%, whole-card tasks served %, GPU time served %, whole cards left %, and the planner's milliseconds per call
(wall time, so it depends on the machine's load: run it with `nice -n 10` and say the load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

from elastic_gpu.sim.builtin import builtin_tasks
from elastic_gpu.sim.compare import parse_seeds
from elastic_gpu.sim.migmix import MigMixSpec, compare_mix

MODELS = ("A100-SXM4-80GB", "A100-SXM4-40GB", "A30-24GB", "H100-80GB", "H200-141GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--mix", default="default")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    base = MigMixSpec.parse(args.mix)
    trace = builtin_tasks()
    rows: list[dict[str, object]] = []
    for model in args.models.split(","):
        spec = replace(base, model=model.strip())
        MigMixSpec.parse(",".join(f"{k}={v}" for k, v in spec.__dict__.items()))  # validate
        for seed in parse_seeds(args.seeds):
            for run in compare_mix(spec, trace, seed):
                rows.append({"model": spec.model, "seed": seed, **run.summary()})
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"mix: {base}; seeds {args.seeds}; load average {os.getloadavg()[0]:.1f}")
    print("| model | layouts | MIG tasks served % | whole-card tasks served % | "
          "GPU time served % | whole cards left % | planner ms per call | cards changed | "
          "merged back |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in dict.fromkeys(str(r["model"]) for r in rows):
        for mode in ("static", "dynamic"):
            mine = [r for r in rows if r["model"] == model and r["mode"] == mode]

            def mean(key: str, rows: list[dict[str, object]] = mine) -> float:
                return statistics.fmean(float(str(r[key])) for r in rows)

            ms = f"{mean('planner_ms_per_call'):.2f}" if mode == "dynamic" else "-"
            print(f"| {model} | {mode} | {mean('mig_served_pct'):.1f} | "
                  f"{mean('whole_served_pct'):.1f} | {mean('gpu_time_served_pct'):.1f} | "
                  f"{mean('whole_cards_left_pct'):.1f} | {ms} | "
                  f"{mean('cards_changed'):.0f} | {mean('cards_merged'):.0f} |")


if __name__ == "__main__":
    main()
