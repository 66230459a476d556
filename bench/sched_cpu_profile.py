"""Where the extender's process spends CPU per pod, in process: a cProfile of the verbs
(`sched_verbs_cpu.one_round`: filter then prioritize as kube-scheduler asks them) and of the
bind with the watch's events of the bound pod (`state_bind.one_run`), each table sorted by
own time, so the next cost to take is the first line that is ours.

    .venv/bin/python bench/sched_cpu_profile.py [--nodes 1000] [--pods 1000] [--top 25]
    .venv/bin/python bench/sched_cpu_profile.py --part bind --sort cumulative

Profiled CPU time (`time.process_time`), with cProfile's own overhead (about 2x): read the
shares of the lines, not the totals; `sched_verbs_cpu.py` and `state_bind.py` give the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time

import sched_verbs_cpu
import state_bind
from sched_scale import freeze_survivors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--part", choices=("verbs", "bind"), nargs="+", default=["verbs", "bind"])
    parser.add_argument("--population", choices=("empty", "busy"), default="empty",
                        help="the verbs' pods (sched_verbs_cpu.py)")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    freeze_survivors()  # the extender's garbage-collection policy
    for part in args.part:
        profile = cProfile.Profile(time.process_time)
        if part == "verbs":
            per_pod = sched_verbs_cpu.one_round(args.nodes, args.pods, args.population == "busy",
                                                1, profile)
            print(f"verbs ({args.population}): {per_pod * 1e3:.3f} ms per filter+prioritize "
                  "under the profiler")
        else:
            asyncio.run(state_bind.one_run(args.nodes, 20, counted=False))  # imports, warm-up
            profile.enable()
            result = asyncio.run(state_bind.one_run(args.nodes, args.pods, counted=False))
            profile.disable()
            print(f"bind: {result['bind_us']:.0f} µs a bind, {result['watch_us']:.0f} µs the "
                  "watch's events, under the profiler (the bench's own copies included)")
        pstats.Stats(profile).strip_dirs().sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
