"""The floor of the extender protocol: kube-scheduler with a do-nothing Python extender
(every node passes, no scores, bind = a plain Binding through the lean REST client, in
the same process) next to kube-scheduler alone and to
the real `egpu scheduler`, same control plane, same pods (`nvidia.com/gpu: 1`). Each extender
also runs in its one-round-trip form: filter passes one node and kube-scheduler has no
prioritize verb (the do-nothing one passes the first name; `egpu scheduler` with
`filterResult: best` the engine's choice).

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
    from elastic_gpu.k8s.rest import RestClient
    from elastic_gpu.scheduler.apiworker import binding_body

    async def main() -> None:
        client = RestClient.from_config(Path(kubeconfig))

        async def filter_(request: web.Request) -> web.Response:
            args = json.loads(await request.read())
            return web.json_response({"NodeNames": args["NodeNames"], "Nodes": None,
                                      "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                                      "Error": ""})

        async def filter_one(request: web.Request) -> web.Response:
            args = json.loads(await request.read())
            return web.json_response({"NodeNames": args["NodeNames"][:1], "Nodes": None,
                                      "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                                      "Error": ""})

        async def prioritize(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response([])

        async def bind(request: web.Request) -> web.Response:
            args = json.loads(await request.read())
            namespace, name = args["PodNamespace"], args["PodName"]
            await client.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                                 body=binding_body(namespace, name, args["PodUID"], args["Node"],
                                                   None, {}))
            return web.json_response({"Error": ""})

        app = web.Application()
        app.router.add_post("/filter", filter_)
        app.router.add_post("/prioritize", prioritize)
        app.router.add_post("/bind", bind)
        app.router.add_post("/one/filter", filter_one)
        app.router.add_post("/one/bind", bind)
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

    from elastic_gpu.devcluster.ports import free_ports
    from elastic_gpu.scheduler.workbench import start_gpu_cluster

    with tempfile.TemporaryDirectory(prefix="egpu-floor-") as tmp:
        work = Path(tmp)
        plane, client, _ = start_gpu_cluster(work, args.nodes, prefix="floor")
        null: subprocess.Popen[bytes] | None = None
        try:
            (null_port,) = free_ports(1)
            null = subprocess.Popen([sys.executable, __file__, "--serve-null",
                                     str(plane.kubeconfig), str(null_port)])
            null_url = f"http://127.0.0.1:{null_port}"
            time.sleep(3)  # the null extender has no readiness endpoint; it needs no caches
            # (key, variant for sched_throughput.measure, round offset, extender URL)
            runs = (("plain", "plain", 0, None), ("null", "egpu", 100, null_url),
                    ("null-best", "egpu-best", 200, f"{null_url}/one"),
                    ("egpu", "egpu", 300, None), ("egpu-best", "egpu-best", 400, None))
            rates: dict[str, list[float]] = {key: [] for key, *_ in runs}
            for r in range(args.rounds):
                for key, variant, offset, url in (runs if r % 2 == 0 else runs[::-1]):
                    rates[key].append(tput.measure(plane, client, work, variant, offset + r,
                                                   args.pods, url))
                print({k: round(v[-1], 1) for k, v in rates.items()}, flush=True)
            plain = statistics.median(rates["plain"])
            print(f"\n{args.pods} pods `nvidia.com/gpu: 1`, {args.nodes} nodes x 8 cards")
            print("| scheduler | pods/s (median) | runs | ratio to kube-scheduler alone |")
            print("|---|---|---|---|")
            for key, label in (("plain", "kube-scheduler alone"),
                               ("null", "+ do-nothing Python extender (filter + prioritize)"),
                               ("null-best", "+ do-nothing Python extender, filter passes one "
                                             "node, no prioritize"),
                               ("egpu", "+ `egpu scheduler` (filter + prioritize)"),
                               ("egpu-best", "+ `egpu scheduler` `filterResult: best`, no "
                                             "prioritize")):
                median = statistics.median(rates[key])
                runs = ", ".join(f"{x:.0f}" for x in rates[key])
                print(f"| {label} | {median:.1f} | {runs} | {median / plain:.2f} |")
            return 0
        finally:
            if null is not None:
                null.kill()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
