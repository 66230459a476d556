"""Extender failover: SIGKILL the leading `egpu scheduler` replica again and again under a
steady stream of GPU pods; the time from each kill to the next GPU pod bound.

    .venv/bin/python bench/sched_failover.py [--kills 20] [--nodes 50] [--rate 5]

Real kube-apiserver, etcd, kube-scheduler and kwok nodes of the dev control plane; two
`egpu scheduler` processes with `leaderElection.enabled` and the default lease settings
(3 s / 2 s / 0.5 s), behind `devcluster.readyproxy` (the stand-in for the chart's Service and
kube-proxy: it reacts within 0.1 s where a readiness probe and endpoint propagation take
about 1-2 s more). Each round: both replicas up (the standby's caches synced), pods binding,
then SIGKILL the leader (no Lease release) and time the next pod bound (from a watch) and
the Lease's acquireTime (the standby taking over); the killed replica comes back as the
standby. "Next GPU pod bound" is the first pod bound at or after that takeover: a Binding the
dead leader had already sent may land just after the kill and is counted apart. At the end
the independent checks (annotations read back from the API, summed per card): 0
over-allocated cards, 0 bound pods without their assignment, 0 pending pods that fit.
Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from egpu_testing.failover import BindClock, ExtenderPair, stream_pods
from egpu_testing.scenario import Progress, check, list_pods
from egpu_testing.workbench import (
    extender_kube_scheduler_config,
    pod_manifest,
    start_gpu_cluster,
)

NAMESPACE = "failover"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--rate", type=float, default=5.0, help="GPU pods created per second")
    parser.add_argument("--warm", type=float, default=2.0,
                        help="seconds of binding before each kill")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-failover-") as tmp:
        work = Path(tmp)
        plane, client, nodes = start_gpu_cluster(work, args.nodes, prefix="ha")
        pair: ExtenderPair | None = None
        stop = threading.Event()
        try:
            plane.kubectl("create", "namespace", NAMESPACE)
            pair = ExtenderPair(plane.kubeconfig, work, NAMESPACE)
            pair.start()
            plane.start_scheduler(extender_kube_scheduler_config(pair.url, pair.scheduler_name),
                                  name="kube-scheduler-egpu")
            # 10% of a card and 1 GiB: 10 a card, so the cluster never fills during the run
            capacity = args.nodes * 8 * 10
            pods = [pod_manifest(f"ha-{i:05d}", NAMESPACE,
                                 limits={"elasticgpu.io/gpu-core": "10",
                                         "elasticgpu.io/gpu-memory": "1024"},
                                 scheduler_name=pair.scheduler_name)
                    for i in range(capacity - 8)]
            progress = Progress()
            to_bind: list[float] = []
            to_lead: list[float] = []
            leftovers = 0
            with BindClock(client, NAMESPACE).running() as clock:
                stream = stream_pods(client, pods, args.rate, progress, stop)
                for round_ in range(args.kills):
                    leader = pair.wait_leader(timeout_s=120)
                    standby = pair.standby_of(leader)
                    if standby.process is None or standby.process.poll() is not None:
                        standby.start(timeout_s=120, standby=True)
                    time.sleep(args.warm)
                    if not stream.is_alive():
                        print("the pod stream ended early (capacity reached)", flush=True)
                        break
                    killed_at = time.time()
                    leader.kill()
                    new = pair.wait_leader(timeout_s=120, other_than=leader)
                    holder, acquired = pair.lease_acquired(client)
                    deadline = time.monotonic() + 120
                    # the first pod the new leader bound (a Binding the dead leader had sent
                    # may still land just after the kill: counted apart, not as recovery)
                    while (bound := clock.first_bound_after(max(acquired, killed_at))) is None:
                        if time.monotonic() > deadline:
                            raise TimeoutError("no pod bound 120 s after the kill:\n"
                                               + pair.log_tails())
                        time.sleep(0.02)
                    leftovers += clock.bound_between(killed_at, acquired)
                    to_bind.append(bound - killed_at)
                    to_lead.append(acquired - killed_at)
                    caught_up = next((line.split("caught up with the API's pods in ")[1]
                                      .split(")")[0] for line in reversed(
                                          new.log_tail(200).splitlines())
                                      if "caught up with the API's pods in" in line), "?")
                    print(f"kill {round_ + 1}: {holder} acquired the Lease after "
                          f"{acquired - killed_at:.2f} s, caught up in {caught_up}, its first "
                          f"pod bound after {bound - killed_at:.2f} s", flush=True)
                    leader.start(timeout_s=120, standby=True)
                stop.set()
                stream.join(timeout=60)
            time.sleep(15)  # let the last backed-off pods bind (kube-scheduler's 10 s max)
            current = list_pods(client, NAMESPACE)
            over, lost, unfit = check(current, nodes)
            bound_total = sum(1 for p in current if (p.get("spec") or {}).get("nodeName"))
            print(f"\nnodes {args.nodes} x 8 cards, {args.rate:g} pods/s, {len(to_bind)} kills, "
                  f"{progress.created} pods created, {bound_total} bound")
            if to_bind:
                print(f"kill -> next GPU pod bound: p50 {statistics.median(to_bind):.2f} s, "
                      f"p99 {percentile(to_bind, 0.99):.2f} s, max {max(to_bind):.2f} s")
                print(f"kill -> Lease acquired by the standby: p50 "
                      f"{statistics.median(to_lead):.2f} s, p99 {percentile(to_lead, 0.99):.2f} s,"
                      f" max {max(to_lead):.2f} s")
                print(f"pods bound between a kill and the takeover (Bindings the dead leader "
                      f"had sent): {leftovers}")
            print(f"cards over capacity: {len(over)} {over[:5]}")
            print(f"bound pods without matching assignment: {len(lost)} {lost[:5]}")
            print(f"pending pods that would fit: {len(unfit)} {unfit[:5]}")
            return 0 if not (over or lost or unfit) else 1
        finally:
            stop.set()
            if pair is not None:
                pair.stop()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
