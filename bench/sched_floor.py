"""The floor of the extender protocol: kube-scheduler with a do-nothing Python extender
(every node passes, no scores, bind = a plain Binding through the lean REST client, in the same
process) next to kube-scheduler alone and to the real `egpu scheduler`, same control plane, same
pods (`nvidia.com/gpu: 1`). Each extender also runs in its one-round-trip form: filter passes
one node and kube-scheduler has no prioritize verb (the do-nothing one passes the first name;
`egpu scheduler` with `filterResult: best` the engine's choice); the do-nothing one also runs
without a bind verb (kube-scheduler binds), which isolates what binding from Python costs.

    .venv/bin/python bench/sched_floor.py --nodes 200 --pods 1500 --rounds 2

Besides pods/s it prints the CPU each kind of process (API server, etcd, kube-scheduler, kwok,
the extender and its API worker, this script's polling) spent per pod between the first and
the last bind: on a box the control plane already keeps busy, that is what decides the ratio.
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
    from elastic_gpu.kube.transport import RestClient
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
    parser.add_argument("--distinct", action="store_true",
                        help="every pod its own CPU request (sched_throughput's *-distinct)")
    parser.add_argument("--only", help="comma-separated runs to measure (plain always): "
                                       "null, null-best, null-kbind, egpu, egpu-best")
    parser.add_argument("--serve-null", nargs=2, metavar=("KUBECONFIG", "PORT"))
    args = parser.parse_args()
    if args.serve_null:
        serve_null(args.serve_null[0], int(args.serve_null[1]))
        return 0

    sys.path.insert(0, str(Path(__file__).parent))
    import sched_throughput as tput

    from egpu_testing.process_cpu import cpu_by_kind, system_total
    from egpu_testing.workbench import start_gpu_cluster
    from elastic_gpu.devcluster.ports import free_ports

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
            # (key, variant for sched_throughput.measure, round offset, extender URL, bindVerb)
            runs = (("plain", "plain", 0, None, True), ("null", "egpu", 100, null_url, True),
                    ("null-best", "egpu-best", 200, f"{null_url}/one", True),
                    ("null-kbind", "egpu-best", 300, f"{null_url}/one", False),
                    ("egpu", "egpu", 400, None, True), ("egpu-best", "egpu-best", 500, None, True))
            if args.only:
                chosen = {"plain", *args.only.split(",")}
                runs = tuple(run for run in runs if run[0] in chosen)
            if args.distinct:
                runs = tuple((key, f"{variant}-distinct", *rest)
                             for key, variant, *rest in runs)
            rates: dict[str, list[float]] = {key: [] for key, *_ in runs}
            cpu: dict[str, list[dict[str, float]]] = {key: [] for key, *_ in runs}
            for r in range(args.rounds):
                for key, variant, offset, url, bind_verb in (runs if r % 2 == 0 else runs[::-1]):
                    rates[key].append(tput.measure(plane, client, work, variant, offset + r,
                                                   args.pods, url, bind_verb=bind_verb,
                                                   probe=cpu_by_kind))
                    cpu[key].append(dict(tput.LAST_WINDOW_CPU))
                print({k: round(v[-1], 1) for k, v in rates.items()}, flush=True)
            plain = statistics.median(rates["plain"])
            shape = "each its own CPU request" if args.distinct else "identical"
            print(f"\n{args.pods} pods `nvidia.com/gpu: 1` ({shape}), {args.nodes} nodes x 8 "
                  "cards")
            print("| scheduler | pods/s (median) | runs | ratio to kube-scheduler alone |")
            print("|---|---|---|---|")
            labels = (("plain", "kube-scheduler alone"),
                      ("null", "+ do-nothing Python extender (filter + prioritize + bind)"),
                      ("null-best", "+ do-nothing Python extender, filter passes one node, "
                                    "bind, no prioritize"),
                      ("null-kbind", "+ do-nothing Python extender, filter passes one node "
                                     "only (kube-scheduler binds)"),
                      ("egpu", "+ `egpu scheduler` (filter + prioritize + bind)"),
                      ("egpu-best", "+ `egpu scheduler` `filterResult: best` (filter + bind)"))
            labels = tuple((key, label) for key, label in labels if key in rates)
            for key, label in labels:
                median = statistics.median(rates[key])
                runs_text = ", ".join(f"{x:.0f}" for x in rates[key])
                print(f"| {label} | {median:.1f} | {runs_text} | {median / plain:.2f} |")
            kinds = sorted({k for rows in cpu.values() for row in rows for k in row})
            print("\nCPU ms per pod between the first and the last bind (median over rounds):")
            print("| scheduler | " + " | ".join(kinds) + " | total |")
            print("|---|" + "---|" * (len(kinds) + 1))
            for key, _ in labels:
                medians = [statistics.median([row.get(k, 0.0) for row in cpu[key]]) * 1000
                           for k in kinds]
                total = system_total(dict(zip(kinds, medians, strict=True)))
                print(f"| {key} | " + " | ".join(f"{m:.2f}" for m in medians)
                      + f" | {total:.2f} |")
            return 0
        finally:
            if null is not None:
                null.kill()
            plane.stop()


if __name__ == "__main__":
    sys.exit(main())
