"""Dynamic MIG on `egpu sandbox up --cluster` (issue 42): how long a pod asking a MIG profile
no card has waits until it is bound on a card carved for it, and a whole-card pod until a
carved card with no holder is merged back.

    PYTHONPATH=src:tests .venv/bin/python bench/mig_dynamic.py [--runs 5] [--cooldown 0]

One sandbox (one node of two A100-SXM4-80GB cards, group `migDynamic: true`); its own
controller (dynamic MIG on, a 10 s cool-down) is stopped and `egpu controller --only
mig-dynamic` run instead with `mergeCooldownSeconds: --cooldown` (0: the merge-back's own
time, without the cool-down; add the cool-down for what a user waits). Each run, in a
fresh namespace: a `nvidia.com/mig-3g.40gb: 1` pod is created and timed until bound (the
extender turns it away, kube-scheduler marks it Unschedulable, the controller writes a
MigLayout, the kwok node's stand-in agent fences the card, waits the fence's settle time
`FENCE_SETTLE_S`, carves, publishes and unfences, the extender wakes the pod, it binds); it is
deleted, and a `nvidia.com/gpu: 2` pod is timed until bound (the carved card merged back the
same way). Prints medians (and the 90th percentile) as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from egpu_testing.controller import ControllerProcess
from egpu_testing.sandbox import egpu, kubectl, kubectl_run
from elastic_gpu.core.mig.apply import FENCE_SETTLE_S
from elastic_gpu.devcluster.ports import free_ports

CLUSTER = """\
nodeGroups:
- {name: dyn, count: 1, gpus: 2, model: A100-SXM4-80GB, memoryMiB: 81920, migDynamic: true}
"""
CONFIG = """\
controllers: [mig-dynamic]
mig:
  dynamic: {{enabled: true, mergeCooldownSeconds: {cooldown}}}
"""


def pod(name: str, limits: dict[str, str]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                           "name": "main", "image": "x", "resources": {"limits": limits}}]}})


def bound(kc: Path, namespace: str, name: str) -> bool:
    got = kubectl_run(kc, "get", "pod", name, "-n", namespace, "-o", "json")
    if got.returncode != 0:
        return False
    obj: dict[str, Any] = json.loads(got.stdout)
    return bool(obj["spec"].get("nodeName"))


def timed(kc: Path, namespace: str, name: str, limits: dict[str, str],
          timeout_s: float = 300) -> float:
    start = time.perf_counter()
    kubectl(kc, "create", "-n", namespace, "-f", "-", input=pod(name, limits))
    while not bound(kc, namespace, name):
        if time.perf_counter() - start > timeout_s:
            raise SystemExit(f"{name} not bound after {timeout_s} s")
        time.sleep(0.05)
    return time.perf_counter() - start


def one_run(kc: Path, i: int) -> tuple[float, float]:
    ns = f"bench-migdyn-{i}"
    kubectl(kc, "create", "namespace", ns)
    carve = timed(kc, ns, "carved", {"nvidia.com/mig-3g.40gb": "1"})
    kubectl(kc, "delete", "pod", "carved", "-n", ns, "--wait=true")
    merge = timed(kc, ns, "whole", {"nvidia.com/gpu": "2"})
    kubectl(kc, "delete", "namespace", ns, "--wait=true")
    return carve, merge


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.9) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cooldown", type=float, default=0.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-bench-migdyn-") as tmp:
        where = Path(tmp)
        state, kc = where / "state", where / "kubeconfig"
        (where / "cluster.yaml").write_text(CLUSTER)
        (where / "controller.yaml").write_text(CONFIG.format(cooldown=args.cooldown))
        up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"),
                  "--state-dir", str(state), "--kubeconfig", str(kc), timeout=300)
        if up.returncode != 0:
            raise SystemExit(up.stderr + up.stdout)
        status = json.loads(egpu("sandbox", "status", "--state-dir", str(state),
                                 "--json").stdout)
        os.kill(int(status["components"]["egpu-controller"]["pid"]), signal.SIGTERM)
        (port,) = free_ports(1)
        ctl = ControllerProcess(kc, port, where / "controller.log",
                                extender_url="http://127.0.0.1:1", identity="bench-migdyn",
                                lease_name="egpu-bench-migdyn",
                                extra=["--config", str(where / "controller.yaml")])
        try:
            ctl.start()
            load = os.getloadavg()[0]
            runs = [one_run(kc, i) for i in range(args.runs)]
            load = max(load, os.getloadavg()[0])
        finally:
            ctl.stop()
            egpu("sandbox", "down", "--state-dir", str(state))
    carve = [c for c, _ in runs]
    merge = [m for _, m in runs]
    print(f"fence settle {FENCE_SETTLE_S:.0f} s per change; merge cool-down {args.cooldown} s; "
          f"1-min load average up to {load:.1f} on {os.cpu_count()} cores")
    print("| what | runs | median | p90 |")
    print("|---|---:|---:|---:|")
    print(f"| `mig-3g.40gb` pod created -> bound on a card carved for it | {len(carve)} | "
          f"{statistics.median(carve):.2f} s | {p90(carve):.2f} s |")
    print(f"| MIG pod gone, `nvidia.com/gpu: 2` pod created -> bound (merge-back) | "
          f"{len(merge)} | {statistics.median(merge):.2f} s | {p90(merge):.2f} s |")


if __name__ == "__main__":
    main()
