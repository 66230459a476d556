"""Failover of the three replicated services: SIGKILL the serving extender, a webhook replica,
the controller leader (each alone, then all three together) again and again under a steady
stream of GPU pods and claims; the time from each kill to the next pod bound and the next
claim Bound.

    .venv/bin/python bench/sched_failover.py [--kills 20] [--nodes 100] [--rate 4]
        [--claim-rate 1] [--rounds extender,webhook,controller,all]

(`--rounds extender --claim-rate 0 --rate 5 --nodes 50 --kills 25`: the extender-only runs of
docs/benchmarks.md, "Extender failover: SIGKILL the leader under a steady stream".)

Real kube-apiserver, etcd, kube-scheduler and kwok nodes of the dev control plane, and:
- two `egpu scheduler` processes with `leaderElection.enabled` and the chart's default lease
  settings (2 s / 1.5 s / 0.5 s), behind `devcluster.readyproxy` (the stand-in for the chart's
  Service and kube-proxy: it reacts within 0.1 s where a readiness probe and endpoint
  propagation take about 1-2 s more);
- two `egpu webhook` processes sharing one serving Secret, registered at a second forwarder
  that spreads kube-apiserver's connections over both (`failurePolicy: Fail`, as the chart);
- two `egpu controller` processes on one Lease with the chart's settings (15 s / 10 s / 2 s,
  `--controller-lease`), calling the extender's `/provision` through its forwarder.

Each round: every replica up (the killed ones restarted: standby, follower), `--warm` seconds
of binding, then SIGKILL (no Lease release, no goodbye) of the round's components; "next pod
bound" is the first pod created after the kill seen bound, "next claim Bound" the same for
claims (from watches). For the extender also the first pod bound after the new leader's
acquireTime (pods created before the kill included: the measure of the extender-only runs
before), and, for every pod created from the kill until the new leader was seen serving,
the time from the kill until it was bound (`failover_gap`: issue 39's measure, p50/p99 per
kill and over all; `--max-backoff 10` runs kube-scheduler with its default backoff, the
configuration shipped before). A webhook round kills the replica that answered more since
the round began (the one kube-apiserver's kept-alive connections reach); creates it refused
are retried every 0.1 s and counted. At the end the independent checks (annotations and
ElasticGPUs read back from the API, summed per card): 0 over-allocated cards, 0 claims bound
twice, 0 lost pods or claims, 0 pending that fit, every create of the stream through. Exit
status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from egpu_testing.claims import install_crds
from egpu_testing.claims_burst import register_kinds
from egpu_testing.failover import (
    COMPONENTS,
    BindClock,
    ClaimClock,
    ControllerPair,
    ExtenderPair,
    FailoverRig,
    KillResult,
    ObjectStream,
    WebhookPair,
    create_immediate_class,
    interleave,
    read_ledger,
    share_claims,
)
from egpu_testing.failover_gap import GapPods, percentile, wait_gap_bound
from egpu_testing.webhook import wait_in_force
from egpu_testing.workbench import (
    extender_kube_scheduler_config,
    pod_manifest,
    start_gpu_cluster,
)

NAMESPACE = "failover"
LABEL = "egpu-failover"




def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"p50 {statistics.median(values):.2f} s, p99 {percentile(values, 0.99):.2f} s, "
            f"max {max(values):.2f} s")


def summary(results: list[KillResult]) -> None:
    print("\n| killed | kills | next pod bound: p50 / p99 (max) | next claim Bound: p50 / p99 "
          "(max) | Lease taken: p50 / p99 | creates refused (kills with any) |")
    print("|---|---|---|---|---|---|")
    for killed in sorted({r.killed for r in results}, key=lambda k: (len(k), k)):
        rows = [r for r in results if r.killed == killed]

        def cell(values: list[float]) -> str:
            return (f"{statistics.median(values):.2f} / {percentile(values, 0.99):.2f} "
                    f"({max(values):.2f})") if values else "-"

        takeovers = [f"{c} {statistics.median(v):.2f} / {percentile(v, 0.99):.2f}"
                     for c in COMPONENTS
                     if (v := [r.takeover_s[c] for r in rows if c in r.takeover_s])]
        claims = [r.claim_bound_s for r in rows if r.claim_bound_s is not None]
        print(f"| {' + '.join(killed)} | {len(rows)} | {cell([r.pod_bound_s for r in rows])} "
              f"| {cell(claims)} | {'; '.join(takeovers) or '-'} | "
              f"{sum(r.refused for r in rows)} ({sum(1 for r in rows if r.refused)}) |")
    after = [r.pod_after_takeover_s for r in results if r.pod_after_takeover_s is not None]
    if after:
        print(f"\nfirst pod bound after the extender's takeover (any pod): {spread(after)}")


def gap_summary(gaps: list[GapPods], results: list[KillResult]) -> None:
    """Every pod created from an extender kill until the new leader served: from the kill to
    bound, over all kills, and each kill's worst; then where the time went, phase by phase."""
    every = [s for gap in gaps for s in gap.bound_s.values()]
    worst = [max(gap.bound_s.values()) for gap in gaps if gap.bound_s]
    if every:
        print(f"\npods created in the extender's failover gap ({len(every)} in {len(gaps)} "
              f"kills), kill -> bound: {spread(every)}; each kill's worst: {spread(worst)}")
    for phase, values in failover_phases(gaps, results).items():
        print(f"  {phase}: {spread(values)}")


def failover_phases(gaps: list[GapPods], results: list[KillResult]
                    ) -> dict[str, list[float]]:
    """The extender kills' time, phase by phase: until the standby took the Lease (its
    acquireTime: the lease expiring on the standby's clock), from then until it was seen
    serving (its catch-up, /readyz, the forwarder's poll), and from then until each pod of the
    gap was bound (kube-scheduler's error backoff, the queue of gap pods, the bind)."""
    by_kill = {r.killed_at: r for r in results if "extender" in r.takeover_s}
    taken, serving, bound = [], [], []
    for gap in gaps:
        result = by_kill.get(gap.killed_at)
        if result is None:
            continue
        taken.append(result.takeover_s["extender"])
        serving.append(gap.served_at - gap.killed_at - result.takeover_s["extender"])
        bound += [s - (gap.served_at - gap.killed_at) for s in gap.bound_s.values()]
    return {"kill -> Lease taken": taken, "Lease taken -> seen serving": serving,
            "seen serving -> each gap pod bound": bound}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="rounds of each --rounds kind")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rate", type=float, default=4.0, help="GPU pods created per second")
    parser.add_argument("--claim-rate", type=float, default=1.0,
                        help="Immediate claims created per second")
    parser.add_argument("--warm", type=float, default=2.0,
                        help="seconds of binding before each kill")
    parser.add_argument("--rounds", default="extender,webhook,controller,all",
                        help="what each round kills, cycled: components or 'all'")
    parser.add_argument("--max-backoff", type=int, default=None,
                        help="kube-scheduler's podMaxBackoffSeconds (default: the shipped "
                             "configuration's; 10: kube-scheduler's own default, as before "
                             "issue 39)")
    parser.add_argument("--controller-lease", default="15,10,2",
                        help="the controller's lease duration, renew deadline and retry "
                             "period, seconds (the chart's defaults)")
    args = parser.parse_args()
    kinds = [tuple(COMPONENTS) if k == "all" else (k,) for k in args.rounds.split(",")]
    if any(c not in COMPONENTS for kind in kinds for c in kind):
        parser.error(f"--rounds: each of {', '.join(COMPONENTS)} or all")
    lease = [float(x) for x in args.controller_lease.split(",")]
    with tempfile.TemporaryDirectory(prefix="egpu-failover-") as tmp:
        work = Path(tmp)
        plane, client, nodes = start_gpu_cluster(work, args.nodes, prefix="ha")
        stop = threading.Event()
        extenders = webhooks = controllers = None
        try:
            plane.kubectl("create", "namespace", NAMESPACE)
            install_crds(plane)
            register_kinds()
            extenders = ExtenderPair(plane.kubeconfig, work, NAMESPACE)
            extenders.start()
            webhooks = WebhookPair(plane.kubeconfig, work, LABEL)
            webhooks.start()
            plane.kubectl("label", "namespace", NAMESPACE, f"{LABEL}={webhooks.name}")
            wait_in_force(plane, NAMESPACE)
            controllers = ControllerPair(plane.kubeconfig, work, NAMESPACE, extenders.url,
                                         lease=lease)
            controllers.start()
            create_immediate_class(plane, "failover")
            config = extender_kube_scheduler_config(extenders.url, extenders.scheduler_name)
            if args.max_backoff is not None:
                config["podMaxBackoffSeconds"] = args.max_backoff
            print(f"kube-scheduler: podInitialBackoffSeconds "
                  f"{config['podInitialBackoffSeconds']}, podMaxBackoffSeconds "
                  f"{config['podMaxBackoffSeconds']}", flush=True)
            plane.start_scheduler(config, name="kube-scheduler-egpu")
            # 10% of a card and 1 GiB each: 10 a card, so the cluster never fills
            slots = args.nodes * 8 * 10 - 8
            per_second = args.rate + args.claim_rate
            claim_count = int(slots * args.claim_rate / per_second)
            pods = [pod_manifest(f"ha-{i:05d}", NAMESPACE,
                                 limits={"elasticgpu.io/gpu-core": "10",
                                         "elasticgpu.io/gpu-memory": "1024"},
                                 scheduler_name=extenders.scheduler_name)
                    for i in range(slots - claim_count)]
            claims = share_claims(claim_count, NAMESPACE, "failover")
            stream = ObjectStream(client, interleave(pods, claims), per_second, stop=stop)
            results: list[KillResult] = []
            gaps: list[GapPods] = []
            with BindClock(client, NAMESPACE).running() as pod_clock, \
                    ClaimClock(client, NAMESPACE).running() as claim_clock:
                rig = FailoverRig(client, extenders, webhooks, controllers, stream, pod_clock,
                                  claim_clock if claims else None)
                rig.ready()
                feeder = stream.start()
                for round_ in range(args.kills * len(kinds)):
                    rig.ready()
                    time.sleep(args.warm)
                    if not feeder.is_alive():
                        print("the stream ended early (capacity reached)", flush=True)
                        break
                    results.append(rig.kill(kinds[round_ % len(kinds)]))
                    print(f"round {round_ + 1}: {results[-1].line()}", flush=True)
                    if results[-1].served_at is not None:
                        gaps.append(wait_gap_bound(pod_clock, stream, results[-1],
                                                   lambda n: not n.startswith("claim-")))
                        print(f"  {gaps[-1].line()}", flush=True)
                stop.set()
                feeder.join(timeout=60)
                time.sleep(20)  # the last backed-off pods and claims (10 s maximum backoffs)
            report = read_ledger(plane, client, NAMESPACE, nodes)
            print(f"\nnodes {args.nodes} x 8 cards, {args.rate:g} pods/s + {args.claim_rate:g} "
                  f"claims/s, {len(results)} rounds, {stream.progress.created} objects created "
                  f"({len(stream.refusals)} refused creates retried, {len(stream.given_up)} "
                  f"given up)")
            summary(results)
            gap_summary(gaps, results)
            print(f"extender leaders that lost the Lease without a kill (renewals failed for "
                  f"the renew deadline; exited and restarted as standbys): {extenders.exited}")
            print(f"\n{report.summary()}")
            claims_made = sum(1 for n in stream.created_at if n.startswith("claim-"))
            complete = (report.claims.bound == claims_made
                        and report.pods_bound == stream.progress.created - claims_made)
            print(f"everything created is bound: {complete}")
            return 0 if report.ok and complete and not stream.given_up else 1
        finally:
            stop.set()
            if controllers is not None:
                controllers.stop()
            if webhooks is not None:
                webhooks.stop(plane)
            if extenders is not None:
                extenders.stop()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
