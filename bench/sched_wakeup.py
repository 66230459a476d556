"""Wake-up latency: GPU capacity freed -> the pending pod that waited for it bound.

Real control plane (etcd, kube-apiserver, kube-scheduler v1.36 with the extender stanza, kwok)
and `egpu scheduler` as a subprocess, as in the integration tests. Each try frees the one card a
pending pod (turned away, marked Unschedulable by kube-scheduler) waits for, and times from the
API call that frees it to the first time the pod is seen bound (polled every 10 ms):

- `delete`: the GPU pod holding the card is deleted. kube-scheduler retries the pending pod on
  the deletion itself; if the extender has not seen the deletion yet it is turned away again
  and the extender's wake-up brings it back (`wakeups` counts how often that was needed).
- `heal`: the card's GPUDevice turns Healthy. kube-scheduler sees no event at all: only the
  wake-up moves the pod (without it: kube-scheduler's five-minute flush).
- `retried`: as `delete`, after the pending pod was retried and turned away 8 more times
  (label changes on the holder, each an event kube-scheduler retries it on), so its backoff
  (1 s doubling per attempt, at most 10 s) is at its longest when the card frees.

    .venv/bin/python bench/sched_wakeup.py --tries 50 [--modes delete heal retried]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from egpu_testing.cluster import TestCluster
from egpu_testing.scenario import create_pods
from egpu_testing.workbench import (
    ExtenderProcess,
    extender_kube_scheduler_config,
    metric_value,
    metrics_text,
    pod_manifest,
)
from elastic_gpu.core.model import Card, Health, Node
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.nodes import register_fake_nodes
from elastic_gpu.devcluster.ports import free_ports

NAMESPACE = "default"
SCHEDULER = "egpu-wakeup"
FILTERS = 'elasticgpu_scheduler_request_duration_seconds_count{verb="filter"}'
WAKEUPS = 'elasticgpu_scheduler_wakeups_total{result="sent"}'


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Bench:
    def __init__(self, plane: ControlPlane, extender: ExtenderProcess) -> None:
        self.client = plane.client()
        self.extender = extender
        self.serial = 0

    def metric(self, sample: str) -> float:
        return metric_value(metrics_text(self.extender.url), sample) or 0.0

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 60.0,
             period_s: float = 0.05) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} after {timeout_s} s")
            time.sleep(period_s)

    def pod(self, node: str) -> str:
        self.serial += 1
        name = f"p{self.serial:04d}"
        manifest = pod_manifest(name, NAMESPACE, limits={"elasticgpu.io/gpu-core": "100"},
                                scheduler_name=SCHEDULER)
        manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        create_pods(self.client, [manifest])
        return name

    def get(self, name: str) -> Any:
        from lightkube.resources.core_v1 import Pod

        return self.client.get(Pod, name, namespace=NAMESPACE)

    def bound(self, name: str) -> bool:
        return bool(self.get(name).spec.nodeName)

    def turned_away(self, name: str) -> bool:
        status = self.get(name).status
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                   for c in (status.conditions if status and status.conditions else []))

    def delete(self, name: str) -> None:
        from lightkube.resources.core_v1 import Pod

        self.client.delete(Pod, name, namespace=NAMESPACE, grace_period=0)

    def time_until_bound(self, name: str, free: Callable[[], None]) -> float:
        started = time.perf_counter()
        free()
        self.wait(f"{name} bound", lambda: self.bound(name), 400, 0.01)
        return time.perf_counter() - started

    def set_health(self, node: str, health: Health) -> None:
        from lightkube.types import PatchType

        from egpu_testing.gpudevice_kind import GPUDevice
        from elastic_gpu.api.gpudevice import object_name

        self.client.patch(GPUDevice.Status, object_name(node, 0),
                          {"status": {"health": health.value}}, patch_type=PatchType.MERGE)

    # ---- modes --------------------------------------------------------------------------

    def deletions(self, node: str, tries: int, retries: int) -> list[float]:
        from lightkube.resources.core_v1 import Pod

        holder = self.pod(node)
        self.wait(f"{holder} bound", lambda: self.bound(holder))
        out = []
        for _ in range(tries):
            waiting = self.pod(node)
            self.wait(f"{waiting} turned away", lambda w=waiting: self.turned_away(w))
            for i in range(retries):
                filters = self.metric(FILTERS)
                self.client.patch(Pod, holder,
                                  {"metadata": {"labels": {"touch": str(i)}}},
                                  namespace=NAMESPACE)
                self.wait("a retry", lambda f=filters: self.metric(FILTERS) > f, 30)
            out.append(self.time_until_bound(waiting, lambda h=holder: self.delete(h)))
            holder = waiting  # the pod just bound holds the card for the next try
        self.delete(holder)
        return out

    def heals(self, node: str, tries: int) -> list[float]:
        out: list[float] = []
        while len(out) < tries:
            self.set_health(node, Health.UNHEALTHY)
            time.sleep(0.5)  # the extender sees the card sick before the pod arrives
            waiting = self.pod(node)
            self.wait(f"{waiting} turned away or bound",
                      lambda w=waiting: self.turned_away(w) or self.bound(w))
            if self.bound(waiting):  # it was bound before the sickness reached the extender
                self.delete(waiting)
                continue
            out.append(self.time_until_bound(
                waiting, lambda: self.set_health(node, Health.HEALTHY)))
            self.delete(waiting)
            # the card is free again in the extender's view before the next try
            self.wait("card free", lambda: self.metric(
                "elasticgpu_scheduler_card_compute_allocated_millicards"
                f'{{device_index="0",node="{node}"}}') == 0)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=50)
    parser.add_argument("--modes", nargs="+", default=["delete", "heal", "retried"],
                        choices=["delete", "heal", "retried"])
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="sched-wakeup-"))
    plane = TestCluster(work_dir=work / "k8s", die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=True)
    extender: ExtenderProcess | None = None
    try:
        from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

        ensure_crd(plane.kube())
        (port,) = free_ports(1)
        extender = ExtenderProcess(plane.kubeconfig, port, work / "extender.log",
                                   config={"filterResult": "all"}, scheduler_name=SCHEDULER)
        extender.start()
        plane.start_scheduler(extender_kube_scheduler_config(extender.url, SCHEDULER),
                              name="kube-scheduler-wakeup")
        nodes = {mode: Node(f"wake-{mode}", 96_000, 786_432,
                            (Card(0, f"GPU-wake-{mode}-0", "A100-SXM4-80GB", 81920),))
                 for mode in args.modes}
        register_fake_nodes(plane.kube(), nodes.values())
        bench = Bench(plane, extender)
        for node in nodes.values():
            bench.wait(f"{node.name} known", lambda n=node.name: bench.metric(
                "elasticgpu_scheduler_card_compute_allocated_millicards"
                f'{{device_index="0",node="{n}"}}') == 0)
        print(f"# {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}"
              f", {args.tries} tries per mode", flush=True)
        print(f"{'mode':8} {'tries':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'mean ms':>8} {'wakeups':>8}")
        for mode in args.modes:
            sent = bench.metric(WAKEUPS)
            node = nodes[mode].name
            if mode == "heal":
                times = bench.heals(node, args.tries)
            else:
                times = bench.deletions(node, args.tries, 8 if mode == "retried" else 0)
            ms = [t * 1000 for t in times]
            print(f"{mode:8} {len(ms):5d} {pct(ms, 0.5):8.0f} {pct(ms, 0.99):8.0f} "
                  f"{max(ms):8.0f} {statistics.fmean(ms):8.0f} "
                  f"{bench.metric(WAKEUPS) - sent:8.0f}", flush=True)
    finally:
        if extender is not None:
            extender.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
