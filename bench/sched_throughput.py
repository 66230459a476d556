"""End-to-end scheduling throughput on 1,000 kwok nodes: kube-scheduler alone vs kube-scheduler
with the Elastic GPU extender, side by side on the same control plane, whole-card pods.

    .venv/bin/python bench/sched_throughput.py --nodes 1000 --pods 2000 --rounds 2

Each round runs both schedulers one after the other (order alternating) on fresh namespaces:
`--pods` pods asking `nvidia.com/gpu: 1` are created at once; throughput is pods bound divided
by the time from the first create to the last bind. kube-scheduler alone counts
nvidia.com/gpu itself (the fake nodes advertise it); with the extender it is a managed,
ignored resource and the extender places and binds. Both kube-schedulers get the same client
QPS. A third row places fractional pods (25% of a card, 8 GiB) with the extender.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from elastic_gpu.agent.inventory_api import ensure_crd
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.nodes import register_fake_nodes, uniform_inventories
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.scheduler.scenario import create_pods, list_pods, unbound_count
from elastic_gpu.scheduler.workbench import (
    ExtenderProcess,
    extender_kube_scheduler_config,
    plain_kube_scheduler_config,
    pod_manifest,
)


def measure(plane: ControlPlane, client: Any, namespace: str, scheduler: str, count: int,
            limits: dict[str, str]) -> float:
    plane.kubectl("create", "namespace", namespace)
    pods = [pod_manifest(f"p-{i:05d}", namespace, limits=limits, scheduler_name=scheduler)
            for i in range(count)]
    start = time.monotonic()
    create_pods(client, pods)
    last_bound, last_change = 0, time.monotonic()
    while True:
        bound = count - unbound_count(client, namespace)
        now = time.monotonic()
        if bound != last_bound:
            last_bound, last_change = bound, now
        if bound == count or now - last_change > 30:
            break
        time.sleep(0.25)
    plane.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0",
                  "--wait=false", check=False)
    if last_bound != count:
        print(f"  {scheduler}: only {last_bound}/{count} bound", flush=True)
    return last_bound / (last_change - start)


def wait_gone(plane: ControlPlane, client: Any, namespaces: list[str]) -> None:
    for namespace in namespaces:
        while list_pods(client, namespace):
            time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-tput-") as tmp:
        work = Path(tmp)
        plane = ControlPlane(work_dir=work / "k8s", die_with_parent=True)
        plane.start(scheduler=False, kwok_enabled=True)
        extender: ExtenderProcess | None = None
        try:
            client = plane.client()
            ensure_crd(client)
            nodes = uniform_inventories(args.nodes, prefix="tput", gpus=8)
            t0 = time.monotonic()
            register_fake_nodes(client, nodes)
            print(f"registered {len(nodes)} nodes in {time.monotonic() - t0:.1f} s", flush=True)
            (port,) = free_ports(1)
            extender = ExtenderProcess(plane.kubeconfig, port, work / "extender.log")
            extender.start(timeout_s=120)
            plane.start_scheduler(plain_kube_scheduler_config("plain"), name="ks-plain")
            plane.start_scheduler(extender_kube_scheduler_config(extender.url, "egpu"),
                                  name="ks-egpu")
            whole = {"nvidia.com/gpu": "1"}
            share = {"elasticgpu.io/gpu-core": "25", "elasticgpu.io/gpu-memory": "8192"}
            results: dict[str, list[float]] = {"plain": [], "egpu": [], "egpu-share": []}
            for r in range(args.rounds):
                order = ["plain", "egpu"] if r % 2 == 0 else ["egpu", "plain"]
                for which in order:
                    ns = f"{which}-{r}"
                    rate = measure(plane, client, ns, which, args.pods, whole)
                    results[which].append(rate)
                    print(f"round {r} {which}: {rate:.1f} pods/s", flush=True)
                    wait_gone(plane, client, [ns])
                ns = f"share-{r}"
                rate = measure(plane, client, ns, "egpu", args.pods, share)
                results["egpu-share"].append(rate)
                print(f"round {r} egpu fractional: {rate:.1f} pods/s", flush=True)
                wait_gone(plane, client, [ns])
            plain = statistics.median(results["plain"])
            egpu = statistics.median(results["egpu"])
            print("| scheduler | pods | nodes | pods/s (median) | ratio to plain |")
            print("|---|---|---|---|---|")
            print(f"| kube-scheduler alone, nvidia.com/gpu: 1 | {args.pods} | {args.nodes} | "
                  f"{plain:.1f} | 1.00 |")
            print(f"| kube-scheduler + extender, nvidia.com/gpu: 1 | {args.pods} | {args.nodes} | "
                  f"{egpu:.1f} | {egpu / plain:.2f} |")
            share_rate = statistics.median(results["egpu-share"])
            print(f"| kube-scheduler + extender, 25% + 8 GiB shares | {args.pods} | {args.nodes} |"
                  f" {share_rate:.1f} | {share_rate / plain:.2f} |")
            return 0
        finally:
            if extender is not None:
                extender.stop()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
