"""CPU per pod of the extender's verbs alone (issue 39, "Cost per pod"): filter then
prioritize, called in process (no HTTP server, no kube-scheduler) as kube-scheduler asks them,
on a state of `--nodes` nodes x 8 cards, pods of distinct shapes (each its own CPU request).

    .venv/bin/python bench/sched_verbs_cpu.py --nodes 1000 --pods 2000 --rounds 5 [--profile F]
    PYTHONPATH=../wt-main/src .venv/bin/python bench/sched_verbs_cpu.py ...   # another checkout

Two populations: `empty` (whole-card pods onto empty nodes, as `sched_throughput.py --cpu`
binds them: nodes fill up and fail as the run goes on) and `busy` (`sched_scale.py`'s eight
pods a node, share pods asked). After each answer the pod is reserved and settled on the
highest-scored node, as its bind would (not timed). The process runs with the extender's
garbage-collection policy (`runtime.gcpolicy`). The figure is process CPU time
(`time.process_time`) per filter+prioritize pair, median of the rounds; `--profile` writes a
cProfile of the timed calls of the last round.
"""

from __future__ import annotations

import argparse
import cProfile
import random
import statistics
import time
from typing import Any

import msgspec
from sched_latency import sample_size
from sched_scale import freeze_survivors, inventory, population, request_pod

from egpu_testing.workbench import feed_nodes, pod_manifest
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state import SchedulerState

try:
    from elastic_gpu.scheduler.extender import Extender
except ImportError:  # another checkout from before the extender was split into objects
    from elastic_gpu.scheduler.server import Extender  # type: ignore[no-redef,attr-defined]


def whole_pod(name: str, i: int) -> dict[str, Any]:
    pod = pod_manifest(name, uid=name, limits={"nvidia.com/gpu": "1"})
    pod["metadata"]["resourceVersion"] = str(i + 2)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{10 + i}m"
    return pod


def build(count: int, busy: bool, seed: int) -> tuple[SchedulerState, Extender]:
    nodes = inventory(count)
    # every fitting node, then prioritize: the pair this bench times (`filterResult: all`; the
    # default `auto` answers these pods with one node and kube-scheduler asks no prioritize)
    state = SchedulerState(SchedulerConfig(filter_result="all"))
    feed_nodes(state, nodes)
    state.replace_pods(population(nodes, random.Random(seed)) if busy else [])
    for source in sorted(state.required_sources):
        state.mark_synced(source)
    return state, Extender(state)


def one_round(count: int, pods: int, busy: bool, seed: int,
              profile: cProfile.Profile | None) -> float:
    """CPU seconds per filter+prioritize pair."""
    state, extender = build(count, busy, seed)
    rng = random.Random(seed)
    names = state.node_names()
    window = sample_size(len(names))
    encode, decode = msgspec.json.encode, msgspec.json.decode
    start, spent = 0, 0.0
    for i in range(pods):
        name = f"p-{i}"
        pod = request_pod(name, i, rng, True) if busy else whole_pod(name, i)
        asked = (names + names)[start:start + window]
        start = (start + window) % len(names)
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": asked})
        t0 = time.process_time()
        if profile is not None:
            profile.enable()
        answer = extender.filter(body)
        feasible = decode(answer.body)["NodeNames"] or []
        scores = []
        if feasible:
            scores = decode(extender.prioritize(
                encode({"Pod": pod, "Nodes": None, "NodeNames": feasible})).body)
        if profile is not None:
            profile.disable()
        spent += time.process_time() - t0
        if scores:
            best = max(scores, key=lambda h: h["Score"])["Host"]
            token, done = state.reserve(pod_request_from_manifest(pod), name, best)
            state.settle(name, token, "bound", with_binding(pod, best, done))
    return spent / pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--population", choices=("empty", "busy"), nargs="+",
                        default=["empty", "busy"])
    parser.add_argument("--profile", help="write a cProfile of the last round here")
    args = parser.parse_args()
    freeze_survivors()  # the extender's garbage-collection policy (`egpu scheduler`)
    for kind in args.population:
        rounds = []
        for r in range(args.rounds):
            profile = cProfile.Profile(time.process_time) if args.profile and r == args.rounds - 1 else None
            rounds.append(one_round(args.nodes, args.pods, kind == "busy", args.seed, profile))
            if profile is not None:
                profile.dump_stats(f"{args.profile}.{kind}")
        print(f"{kind}: {statistics.median(rounds) * 1e3:.3f} ms CPU per filter+prioritize "
              f"(median of {args.rounds}; rounds {', '.join(f'{x * 1e3:.3f}' for x in rounds)})",
              flush=True)


if __name__ == "__main__":
    main()
