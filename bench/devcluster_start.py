"""Start-up times of the development control plane and of `egpu sandbox up`, binaries cached.

    .venv/bin/python bench/devcluster_start.py [--runs 3] [--nodes 100] [--no-controller-manager]

Measures, `--runs` times each, and prints the medians as a Markdown table:
- control plane start: etcd + kube-apiserver + kube-controller-manager (unless
  `--no-controller-manager`) + kube-scheduler + kwok, all ready (the pytest
  `k8s_cluster` fixture's start), and its stop;
- `egpu sandbox up --gpu-nodes N`: the CLI end to end (its own Python start-up included) until
  all N fake GPU nodes are Ready (and, since issue 13, the extender it runs knows them; see
  bench/sandbox_up.py for the steps), and `egpu sandbox down`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from egpu_testing.sandbox import timed_egpu
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.controlplane import ControlPlane


def time_control_plane(bin_dir: Path, controller_manager: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        plane = ControlPlane(work_dir=Path(tmp), bin_dir=bin_dir, die_with_parent=True)
        start = time.perf_counter()
        plane.start(scheduler=True, kwok_enabled=True, controller_manager=controller_manager)
        started = time.perf_counter() - start
        start = time.perf_counter()
        plane.stop()
        return started, time.perf_counter() - start


def time_sandbox(nodes: int, controller_manager: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="egpu-bench-sandbox-") as tmp:
        state, kc = Path(tmp) / "state", Path(tmp) / "kubeconfig"
        extra = [] if controller_manager else ["--no-controller-manager"]
        up, _ = timed_egpu("sandbox", "up", "--gpu-nodes", str(nodes), "--kubeconfig", str(kc),
                           "--state-dir", str(state), *extra)
        down, _ = timed_egpu("sandbox", "down", "--state-dir", str(state))
        return up, down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write the raw timings here")
    parser.add_argument("--no-controller-manager", action="store_true",
                        help="leave kube-controller-manager out (as before issue 13)")
    args = parser.parse_args()
    bin_dir = find_bin_dir()

    kcm = not args.no_controller_manager
    plane = [time_control_plane(bin_dir, kcm) for _ in range(args.runs)]
    box = [time_sandbox(args.nodes, kcm) for _ in range(args.runs)]
    parts = "etcd+apiserver+controller-manager+scheduler+kwok" if kcm else \
        "etcd+apiserver+scheduler+kwok"
    rows = [
        (f"control plane start ({parts} ready)", [p[0] for p in plane]),
        ("control plane stop", [p[1] for p in plane]),
        (f"`egpu sandbox up --gpu-nodes {args.nodes}` (all nodes Ready)", [b[0] for b in box]),
        ("`egpu sandbox down`", [b[1] for b in box]),
    ]
    print(f"| what | median s (of {args.runs}) | runs s |")
    print("|---|---|---|")
    for what, values in rows:
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {what} | {statistics.median(values):.2f} | {runs} |")
    if args.json:
        args.json.write_text(json.dumps({what: values for what, values in rows}, indent=2))


if __name__ == "__main__":
    main()
