"""The extender's start to ready on a real API server (issue 29): N nodes x 8 cards, 8 pods a node.

One control plane (etcd, kube-apiserver; no kube-scheduler, no kwok, no controller manager:
nothing else reads or writes while we measure) is filled with N Nodes and their GPUDevices
(the objects devcluster registers for a fake node) and `sched_scale.population`'s 8 bound
pods a node, with their assignment annotations, by `egpu_testing.bulkload`: devcluster's
requests sent many at a time from one event loop (10-20 % less CPU than blocking calls from
threads; kube-apiserver's CPU per write is the bound: `bench/cluster_load.py`,
docs/benchmarks.md). Then `egpu scheduler` is started `--runs` times for each tree; each run
is timed from the process's launch to its `/readyz` answering 200 (its API worker has listed
nodes, GPUDevices, pods and the claim kinds, and the state has counted every pod's cards),
and its peak memory is read from /proc (VmHWM of the scheduler process and of its API worker
child). `--tree NAME=SRC` runs another source tree's extender (PYTHONPATH=SRC) on the same
loaded cluster, alternating with this one run by run:

    git archive main src | tar -x -C /tmp/ready-main
    .venv/bin/python bench/sched_ready.py --nodes 1000 5000 15000 --runs 2 \
        --tree main=/tmp/ready-main/src
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from sched_scale import inventory, population

from egpu_testing.bulkload import DEFAULT_CONCURRENCY, LoadReport, load_cluster
from egpu_testing.cluster import TestCluster
from egpu_testing.workbench import ExtenderProcess
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports

#: The tree this script runs from (its own package), named in the table.
THIS_TREE = "this"


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


def load_population(kubeconfig: Path, count: int, seed: int, concurrency: int
                    ) -> tuple[float, float, int]:
    """Fill a new cluster with `count` nodes and their pods: (seconds for the nodes, for the
    pods, pods created)."""
    nodes = inventory(count)
    loaded = load_cluster(kubeconfig, nodes, concurrency=concurrency, progress=progress)
    pods = population(nodes, random.Random(seed))
    bound = load_cluster(kubeconfig, [], pods, concurrency=concurrency, progress=progress)
    return loaded.seconds, bound.seconds, bound.pods


def progress(report: LoadReport) -> None:
    print(f"  loaded {report.nodes} nodes, {report.pods} pods ({report.requests} requests, "
          f"{report.retries} resent) in {time.monotonic() - report.started:.0f} s; "
          f"load {load()}", file=sys.stderr, flush=True)


def rss_mib(pid: int) -> float:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def plane_size(plane: ControlPlane) -> dict[str, float]:
    """What holding the cluster costs: etcd's database, and the RSS of etcd and the API
    server (does a size fit the box?)."""
    request = urllib.request.Request(f"http://127.0.0.1:{plane.etcd_port}/v3/maintenance/status",
                                     data=b"{}")
    with urllib.request.urlopen(request, timeout=10) as response:
        status = json.loads(response.read())
    return {"etcd_db_mib": int(status.get("dbSize", 0)) / 2**20,
            "etcd_rss_mib": rss_mib(plane.processes["etcd"].pid),
            "apiserver_rss_mib": rss_mib(plane.processes["kube-apiserver"].pid)}


def start_once(plane: ControlPlane, port: int, log: Path, src: str | None
               ) -> tuple[float, float, float]:
    """One extender start: (seconds to ready, peak MiB of the scheduler, of its API worker)."""
    extender = ExtenderProcess(plane.kubeconfig, port, log)
    watch: PeakWatch | None = None

    def ready_now(extender: ExtenderProcess = extender) -> bool:
        nonlocal watch
        if watch is None and extender.process is not None:
            watch = PeakWatch(extender.process.pid)
        return extender.readyz()[0] == 200

    extender.ready = ready_now  # type: ignore[method-assign]
    saved = os.environ.get("PYTHONPATH")
    if src is not None:  # the extender and its API worker import that tree's package
        os.environ["PYTHONPATH"] = src
    started = time.monotonic()
    try:
        extender.start(timeout_s=900)
        ready = time.monotonic() - started
    finally:
        if src is not None:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        if watch is not None:
            watch.stop()
        extender.stop()
    assert watch is not None
    return ready, watch.main, watch.workers


def one_size(count: int, runs: int, seed: int, work: Path, trees: dict[str, str | None],
             concurrency: int) -> list[dict[str, Any]]:
    plane = TestCluster(work_dir=work / f"k8s-{count}", die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=False, controller_manager=False)
    try:
        nodes_s, pods_s, pod_count = load_population(plane.kubeconfig, count, seed, concurrency)
        size = plane_size(plane)
        print(f"{count} nodes: registered in {nodes_s:.0f} s, {pod_count} pods created in "
              f"{pods_s:.0f} s; etcd db {size['etcd_db_mib']:.0f} MiB, etcd RSS "
              f"{size['etcd_rss_mib']:.0f} MiB, kube-apiserver RSS "
              f"{size['apiserver_rss_mib']:.0f} MiB; load {load()}", file=sys.stderr, flush=True)
        results: dict[str, dict[str, list[float]]] = {
            name: {"ready": [], "main": [], "worker": [], "load": []} for name in trees}
        for run in range(runs):
            for name, src in trees.items():
                (port,) = free_ports(1)
                before = load()
                ready, main, worker = start_once(
                    plane, port, work / f"extender-{count}-{name}-{run}.log", src)
                r = results[name]
                r["ready"].append(ready)
                r["main"].append(main)
                r["worker"].append(worker)
                r["load"].append(before)
                print(f"  {count} nodes, {name}, run {run}: ready {ready:.1f} s, scheduler "
                      f"{main:.0f} MiB, API worker {worker:.0f} MiB (load {before:.1f})",
                      file=sys.stderr, flush=True)
        return [{"nodes": count, "tree": name, "objects": count * 17,
                 "ready_s": statistics.median(r["ready"]), "ready_runs": r["ready"],
                 "main_mib": max(r["main"]), "worker_mib": max(r["worker"]),
                 "load": r["load"], "register_s": nodes_s, "pods_s": pods_s, **size}
                for name, r in results.items()]
    finally:
        plane.stop()


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 15000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help="requests in flight while loading the cluster")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC",
                        help="also start the extender of another source tree (its src/ "
                             "directory), alternating with this one")
    args = parser.parse_args()
    trees: dict[str, str | None] = {}
    for spec in args.tree:
        name, sep, src = spec.partition("=")
        if not sep or not Path(src, "elastic_gpu").is_dir():
            parser.error(f"--tree {spec!r}: give NAME=SRC, SRC a directory holding elastic_gpu")
        trees[name] = str(Path(src).resolve())
    trees[THIS_TREE] = None
    print("| nodes | tree | start to ready (median; runs) | peak RSS, scheduler | "
          "peak RSS, API worker | load at each start |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="egpu-ready-") as tmp:
        for count in args.nodes:
            for r in one_size(count, args.runs, args.seed, Path(tmp), trees, args.concurrency):
                runs = ", ".join(f"{v:.1f}" for v in r["ready_runs"])
                loads = ", ".join(f"{v:.1f}" for v in r["load"])
                print(f"| {count:,} | {r['tree']} | {r['ready_s']:.1f} s ({runs}) | "
                      f"{r['main_mib']:.0f} MiB | {r['worker_mib']:.0f} MiB | {loads} |",
                      flush=True)


if __name__ == "__main__":
    main()
