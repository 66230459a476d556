"""The floor of the extender protocol: kube-scheduler with a do-nothing Python extender
(every node passes, no scores, bind = a plain Binding) next to kube-scheduler alone and to
the real `egpu scheduler`, same control plane, same pods (`nvidia.com/gpu: 1`).

    .venv/bin/python bench/sched_floor.py --nodes 200 --pods 600 --rounds 2

It separates what the extender architecture costs (two HTTP round trips per pod in
kube-scheduler's scheduling cycle, a Python HTTP server, a Binding from Python, no batching
of identical pods) from what our placement logic costs on top.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web


def serve_null(kubeconfig: str, port: int) -> None:
    from elastic_gpu.k8s.client import async_client
    from elastic_gpu.scheduler.api import LightkubePodApi

    async def main() -> None:
        api = LightkubePodApi(async_client(Path(kubeconfig), field_manager="null-extender"))

        async def filter_(request: web.Request) -> web.Response:
            args = json.loads(await request.read())
            return web.json_response({"NodeNames": args["NodeNames"], "Nodes": None,
                                      "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                                      "Error": ""})

        async def prioritize(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response([])

        async def bind(request: web.Request) -> web.Response:
            args = json.loads(await request.read())
            await api.bind(args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"],
                           None, {})
            return web.json_response({"Error": ""})

        app = web.Application()
        app.router.add_post("/filter", filter_)
        app.router.add_post("/prioritize", prioritize)
        app.router.add_post("/bind", bind)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve-null", nargs=2, metavar=("KUBECONFIG", "PORT"))
    args = parser.parse_args()
    if args.serve_null:
        serve_null(args.serve_null[0], int(args.serve_null[1]))
        return 0

    sys.path.insert(0, str(Path(__file__).parent))
    import sched_throughput as tput

    from elastic_gpu.agent.inventory_api import ensure_crd
    from elastic_gpu.devcluster.controlplane import ControlPlane
    from elastic_gpu.devcluster.nodes import register_fake_nodes, uniform_inventories
    from elastic_gpu.devcluster.ports import free_ports
    from elastic_gpu.scheduler.workbench import ExtenderProcess

    with tempfile.TemporaryDirectory(prefix="egpu-floor-") as tmp:
        plane = ControlPlane(work_dir=Path(tmp) / "k8s", die_with_parent=True)
        plane.start(scheduler=False, kwok_enabled=True)
        null: subprocess.Popen[bytes] | None = None
        extender: ExtenderProcess | None = None
        try:
            client = plane.client()
            ensure_crd(client)
            register_fake_nodes(client, uniform_inventories(args.nodes, prefix="floor", gpus=8))
            null_port, egpu_port = free_ports(2)
            null = subprocess.Popen([sys.executable, __file__, "--serve-null",
                                     str(plane.kubeconfig), str(null_port)])
            extender = ExtenderProcess(plane.kubeconfig, egpu_port, Path(tmp) / "egpu.log")
            extender.start()
            null_handle = ExtenderProcess(plane.kubeconfig, null_port, Path(tmp) / "null.log")
            time.sleep(3)  # the null extender has no readiness endpoint; it needs no caches
            rates: dict[str, list[float]] = {"plain": [], "null": [], "egpu": []}
            for r in range(args.rounds):
                rates["plain"].append(tput.measure(plane, client, extender, "plain", r, args.pods))
                rates["null"].append(tput.measure(plane, client, null_handle, "egpu", 100 + r,
                                                  args.pods))
                rates["egpu"].append(tput.measure(plane, client, extender, "egpu", 200 + r,
                                                  args.pods))
                print({k: round(v[-1], 1) for k, v in rates.items()}, flush=True)
            plain = statistics.median(rates["plain"])
            print(f"\n{args.pods} pods `nvidia.com/gpu: 1`, {args.nodes} nodes x 8 cards")
            print("| scheduler | pods/s (median) | runs | ratio to kube-scheduler alone |")
            print("|---|---|---|---|")
            for key, label in (("plain", "kube-scheduler alone"),
                               ("null", "+ do-nothing Python extender"),
                               ("egpu", "+ `egpu scheduler`")):
                median = statistics.median(rates[key])
                runs = ", ".join(f"{x:.0f}" for x in rates[key])
                print(f"| {label} | {median:.1f} | {runs} | {median / plain:.2f} |")
            return 0
        finally:
            if null is not None:
                null.kill()
            if extender is not None:
                extender.stop()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
