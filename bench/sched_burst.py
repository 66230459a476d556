"""Full-size concurrency and restart check: 2,000 fractional pods at once onto 200 kwok nodes
of 8 cards, with the real kube-scheduler and `egpu scheduler`, optionally SIGKILLing the
extender once a third of the pods are bound.

    .venv/bin/python bench/sched_burst.py --nodes 200 --pods 2000 [--kill]

Prints the independent checks (annotations read back from the API, summed per card): cards
over 100% compute or memory, bound pods without a matching assignment, pending pods that
would fit; and the time from the first create to the last bind. Exit status 1 if a check
fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from egpu_testing.scenario import fractional_pods, run_burst
from egpu_testing.workbench import (
    ExtenderProcess,
    extender_kube_scheduler_config,
    start_gpu_cluster,
)
from elastic_gpu.devcluster.ports import free_ports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--kill", action="store_true", help="SIGKILL + restart the extender")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-burst-") as tmp:
        work = Path(tmp)
        plane, client, nodes = start_gpu_cluster(work, args.nodes, prefix="burst")
        extender: ExtenderProcess | None = None
        try:
            (port,) = free_ports(1)
            extender = ExtenderProcess(plane.kubeconfig, port, work / "extender.log",
                                       scheduler_name="egpu")
            extender.start()
            plane.start_scheduler(extender_kube_scheduler_config(extender.url, "egpu"),
                                  name="kube-scheduler-egpu")
            plane.kubectl("create", "namespace", "burst")
            pods = fractional_pods(args.pods, "egpu", "burst", seed=args.seed)
            killed: list[int] = []

            def progress(bound: int, elapsed: float) -> None:
                assert extender is not None
                if args.kill and not killed and bound >= args.pods // 3:
                    extender.kill()
                    killed.append(bound)
                    print(f"SIGKILL at {bound} bound ({elapsed:.1f} s); restarting", flush=True)
                    t = time.monotonic()
                    extender.start(timeout_s=120)
                    print(f"extender ready again after {time.monotonic() - t:.1f} s", flush=True)

            result = run_burst(client, "burst", pods, nodes, quiet_s=25, timeout_s=1800,
                               on_progress=progress)
            demand = sum(int(p["spec"]["containers"][0]["resources"]["limits"].get(
                "elasticgpu.io/gpu-core", p["spec"]["containers"][0]["resources"]["limits"].get(
                    "tencent.com/vcuda-core", p["spec"]["containers"][0]["resources"]["limits"].get(
                        "nano-gpu/gpu-percent", "0")))) for p in pods)
            print(f"pods: {result.pods} (compute asked: {demand / 100:.0f} cards of "
                  f"{args.nodes * 8})")
            print(f"bound: {result.bound}; last bind {result.seconds_to_last_bind:.1f} s after "
                  f"the first create ({result.bound / max(result.seconds_to_last_bind, 1e-9):.1f}"
                  " pods/s)")
            print(f"cards over capacity: {len(result.overcommitted)} {result.overcommitted[:5]}")
            print(f"bound pods without matching assignment: {len(result.lost)} {result.lost[:5]}")
            print(f"pending pods that would fit: {len(result.unbound_but_fit)} "
                  f"{result.unbound_but_fit[:5]}")
            if args.kill:
                print(f"extender starts: {extender.starts}, killed at {killed}")
            return 0 if result.ok else 1
        finally:
            if extender is not None:
                extender.stop()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
