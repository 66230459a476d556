"""The extender's start to ready on a real API server (issue 29): N nodes x 8 cards, 8 pods a node.

One control plane (etcd, kube-apiserver; no kube-scheduler, no kwok: nothing else reads or
writes while we measure) is filled with N Nodes and their GPUDevices (registered by the fake
agent's own publishing code) and `sched_scale.population`'s 8 bound pods a node, with their
assignment annotations. Then `egpu scheduler` is started `--runs` times; each run is timed
from the process's launch to its `/readyz` answering 200 (its API worker has listed nodes,
GPUDevices, pods and the claim kinds, and the state has counted every pod's cards), and its
peak memory is read from /proc (VmHWM of the scheduler process and of its API worker child).

    .venv/bin/python bench/sched_ready.py --nodes 1000 5000 15000 --runs 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sched_scale import inventory, population

from egpu_testing.cluster import TestCluster
from egpu_testing.scenario import create_pods
from egpu_testing.workbench import ExtenderProcess
from elastic_gpu.agent.inventory_api import ensure_crd
from elastic_gpu.devcluster.nodes import register_fake_nodes
from elastic_gpu.devcluster.ports import free_ports


def peak_mib(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, MiB; 0 when it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:  # it exited between the listing and the read
        return 0.0
    for line in lines:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class PeakWatch:
    """Samples the peak memory of a process and its children while it starts (a child's
    VmHWM is lost when it exits, and the API worker is restarted on failures)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.main = 0.0
        self.workers = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        self.main = max(self.main, peak_mib(self.pid))
        for child in children(self.pid):
            self.workers = max(self.workers, peak_mib(child))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def one_size(count: int, runs: int, seed: int, work: Path) -> dict[str, Any]:
    plane = TestCluster(work_dir=work / f"k8s-{count}", die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=False)
    try:
        ensure_crd(plane.kube())
        nodes = inventory(count)
        t0 = time.monotonic()
        register_fake_nodes(plane.kube(), nodes, parallelism=16)
        t1 = time.monotonic()
        pods = population(nodes, random.Random(seed))
        for pod in pods:  # the API server names the uid; the one sched_scale sets is its own
            pod["metadata"].pop("uid", None)
            pod["metadata"].pop("resourceVersion", None)
        create_pods(plane.client(), pods, parallelism=16)
        t2 = time.monotonic()
        print(f"{count} nodes: registered in {t1 - t0:.0f} s, {len(pods)} pods created in "
              f"{t2 - t1:.0f} s", file=sys.stderr, flush=True)
        ready: list[float] = []
        mains: list[float] = []
        workers: list[float] = []
        for run in range(runs):
            (port,) = free_ports(1)
            extender = ExtenderProcess(plane.kubeconfig, port, work / f"extender-{count}-{run}.log")
            started = time.monotonic()
            watch: PeakWatch | None = None

            def ready_now(extender: ExtenderProcess = extender) -> bool:
                nonlocal watch
                if watch is None and extender.process is not None:
                    watch = PeakWatch(extender.process.pid)
                return extender.readyz()[0] == 200

            extender.ready = ready_now  # type: ignore[method-assign]
            try:
                extender.start(timeout_s=600)
                ready.append(time.monotonic() - started)
            finally:
                if watch is not None:
                    watch.stop()
                    mains.append(watch.main)
                    workers.append(watch.workers)
                extender.stop()
        return {"nodes": count, "pods": len(pods), "ready_s": statistics.median(ready),
                "ready_runs": ready, "main_mib": max(mains), "worker_mib": max(workers)}
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 15000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("| nodes | bound pods | start to ready (median; runs) | peak RSS, scheduler | "
          "peak RSS, API worker |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="egpu-ready-") as tmp:
        for count in args.nodes:
            r = one_size(count, args.runs, args.seed, Path(tmp))
            runs = ", ".join(f"{v:.1f}" for v in r["ready_runs"])
            print(f"| {count} | {r['pods']:.0f} | {r['ready_s']:.1f} s ({runs}) | "
                  f"{r['main_mib']:.0f} MiB | {r['worker_mib']:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
