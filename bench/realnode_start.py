"""Start-up times of the real kubelet node, and pod start on it.

    .venv/bin/python bench/realnode_start.py [--runs 3] [--pods 10]

Measures, and prints the medians as a Markdown table:
- `egpu sandbox up --gpu-nodes 1 --real-nodes 1`: the CLI end to end (its Python start-up, the
  control plane, one kwok node, the real node Ready, its agent registered), and `sandbox down`
  (everything stopped, the real node's cgroups and state removed), `--runs` times; and the
  same without the real node (`--real-nodes 0`) as the baseline;
- the real node alone (`RealNode.start` against a running control plane: images written and
  imported, namespace, containerd, kubelet, Node Ready) and its `stop`, `--runs` times;
- pod start on the real node: create -> Running (phase seen by a watch) for `--pods` busybox
  pods created one after another (each waits for the one before), and create -> the
  container's log line (the container really ran).

Needs what a real node needs (root, containerd, runc, busybox-static; docs/sandbox.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from egpu_testing.cluster import TestCluster
from egpu_testing.sandbox import timed_egpu
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode, unavailable_reason


def time_sandbox(real_nodes: int = 1) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="egpu-bsb-") as tmp:
        state, kc = Path(tmp) / "state", Path(tmp) / "kubeconfig"
        up, _ = timed_egpu("sandbox", "up", "--gpu-nodes", "1", "--real-nodes", str(real_nodes),
                           "--kubeconfig", str(kc), "--state-dir", str(state))
        down, _ = timed_egpu("sandbox", "down", "--state-dir", str(state))
        return up, down


def pod_manifest(name: str, image: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"elasticgpu.io/real-node": "true"},
                     "tolerations": [REAL_NODE_TOLERATION], "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": True,
                     "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "echo started; exec sleep 3600"]}]}}


def time_pods(plane: ControlPlane, node: RealNode, count: int) -> tuple[list[float], list[float]]:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    client = plane.client()
    running, logged = [], []
    for i in range(count):
        name = f"bench-{i}"
        obj = codecs.from_dict(pod_manifest(name, node.busybox_image))
        start = time.perf_counter()
        client.create(obj, namespace="default")
        for _, pod in client.watch(Pod, namespace="default",
                                   fields={"metadata.name": name}):
            if pod.status and pod.status.phase == "Running":
                break
        running.append(time.perf_counter() - start)
        while "started" not in plane.kubectl("logs", name, check=False).stdout:
            time.sleep(0.02)
        logged.append(time.perf_counter() - start)
        plane.kubectl("delete", "pod", name, "--grace-period=0", "--force", "--wait=false")
    return running, logged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pods", type=int, default=10)
    args = parser.parse_args()
    bin_dir = find_bin_dir()
    reason = unavailable_reason(bin_dir)
    if reason is not None:
        raise SystemExit(f"this machine cannot run a real node: {reason}")

    sandbox = [time_sandbox() for _ in range(args.runs)]
    baseline = [time_sandbox(0) for _ in range(args.runs)]
    node_start, node_stop = [], []
    running: list[float] = []
    logged: list[float] = []
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        plane = TestCluster(work_dir=Path(tmp) / "cp", bin_dir=bin_dir, die_with_parent=True)
        plane.start(scheduler=True, kwok_enabled=False)
        try:
            for run in range(args.runs):
                node = RealNode("egpu-real-0", Path(tmp) / "rn", plane, die_with_parent=True)
                start = time.perf_counter()
                node.start()
                node_start.append(time.perf_counter() - start)
                try:
                    if run == 0:
                        running, logged = time_pods(plane, node, args.pods)
                finally:
                    start = time.perf_counter()
                    node.stop(delete_node=True)
                    node_stop.append(time.perf_counter() - start)
        finally:
            plane.stop()

    def cell(values: list[float]) -> str:
        return (f"{statistics.median(values):.2f} "
                f"({', '.join(f'{v:.2f}' for v in values)})")

    print("| what | median s (runs) |")
    print("|---|---|")
    print(f"| `egpu sandbox up --gpu-nodes 1 --real-nodes 1` | {cell([u for u, _ in sandbox])} |")
    print(f"| `egpu sandbox down` (with the real node) | {cell([d for _, d in sandbox])} |")
    print(f"| baseline: `egpu sandbox up --gpu-nodes 1` | {cell([u for u, _ in baseline])} |")
    print(f"| baseline: `egpu sandbox down` | {cell([d for _, d in baseline])} |")
    print(f"| real node start (`RealNode.start`, Node Ready) | {cell(node_start)} |")
    print(f"| real node stop (`RealNode.stop`, nothing left) | {cell(node_stop)} |")
    print(f"| pod create -> Running ({args.pods} pods) | {statistics.median(running):.2f} "
          f"(min {min(running):.2f}, max {max(running):.2f}) |")
    print(f"| pod create -> container's first log line | {statistics.median(logged):.2f} "
          f"(min {min(logged):.2f}, max {max(logged):.2f}) |")
    print(json.dumps({"sandbox": sandbox, "baseline": baseline, "node_start": node_start,
                      "node_stop": node_stop, "running": running, "logged": logged}), file=sys.stderr)


if __name__ == "__main__":
    main()
