"""ElasticGPUClaim creation -> Bound latency and claims per second on a sandbox (issue #15,
must-show 5; goal: p99 <= 1 s at 100 claims/s).

    PYTHONPATH=src:tests .venv/bin/python bench/claims_latency.py --rate 100 --claims 500

Starts `egpu sandbox up --gpu-nodes N` (the whole system: webhook, extender, `egpu
controller`), applies the seed README's class (gpushare provisioner, Immediate binding), then
creates `--claims` claims of the README's size (gpu-core 10, gpu-memory 4) at `--rate` claims
per second (paced by their due times, `--workers` creating in parallel), while a watch of
claims notes when each one first says `status.phase: Bound`. The latency of a claim is from
just before its create call to the watch event that shows it Bound (both on this machine's
monotonic clock). Prints a Markdown table: the create rate achieved, latency p50 / p99 / max,
and claims Bound per second (claims / time from the first create to the last Bound); and the
claims not Bound within `--timeout` seconds of the last create, if any. `--cpu` also prints
the CPU seconds (user + system) each of the sandbox's processes (with its children: the
extender's API worker, kube-apiserver's ...) used from the first create to the end of the wait,
read from /proc: where the box's two cores went; and the API requests kube-apiserver served
meanwhile by verb and resource (`apiserver_request_total`, of every client): the writes a
claim costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from egpu_testing.sandbox import kubectl, timed_egpu
from egpu_testing.seed import SEED_CLASS, seed_claim


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_by_group(leaders: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) of the live processes of each named process group (the
    sandbox starts every component as a group leader)."""
    tick = os.sysconf("SC_CLK_TCK")
    by_group = {pid: name for name, pid in leaders.items()}
    out = dict.fromkeys(leaders, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = by_group.get(int(fields[2]))
        if name is not None:
            out[name] += (int(fields[11]) + int(fields[12])) / tick
    return out


def api_requests(kc: Path) -> dict[str, float]:
    """kube-apiserver's `apiserver_request_total` summed by "VERB resource[/subresource]"."""
    import re

    out: dict[str, float] = {}
    pattern = re.compile(r'^apiserver_request_total\{(.*)\} (\S+)$')
    for line in kubectl(kc, "get", "--raw", "/metrics").splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        what = f"{labels.get('verb')} {labels.get('resource')}"
        if labels.get("subresource"):
            what += f"/{labels['subresource']}"
        out[what] = out.get(what, 0.0) + float(match.group(2))
    return out


def claim_body(name: str, namespace: str) -> dict[str, Any]:
    import yaml

    body: dict[str, Any] = yaml.safe_load(seed_claim(name))
    body["metadata"]["namespace"] = namespace
    return body


class BoundWatch:
    """A watch of the namespace's claims: when each was first seen Bound (monotonic)."""

    def __init__(self, client: Any, resource: Any, namespace: str) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.lock = threading.Lock()
        self.started = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                listing = self.client.list(self.resource, namespace=self.namespace)
                for item in listing:
                    self._see(item.to_dict())
                self.started.set()
                for _, item in self.client.watch(self.resource, namespace=self.namespace,
                                                 resource_version=listing.resourceVersion):
                    self._see(item.to_dict())
                    if self.stop.is_set():
                        return
            except Exception as err:  # an expired watch: list again
                if self.stop.is_set():
                    return
                print(f"watch: {err}; listing again")
                time.sleep(0.2)

    def _see(self, obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("phase") == "Bound":
            name = obj["metadata"]["name"]
            with self.lock:
                self.bound.setdefault(name, time.monotonic())


def run(kc: Path, claims: int, rate: float, workers: int, timeout_s: float,
        leaders: dict[str, int] | None = None) -> dict[str, Any]:
    from lightkube import Client, KubeConfig
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    from elastic_gpu.api.elasticgpu import CLAIM_KIND, CLAIM_PLURAL, GROUP, VERSION

    kubectl(kc, "apply", "-f", "-", input=SEED_CLASS)
    client = Client(config=KubeConfig.from_file(str(kc)), field_manager="egpu-bench",
                    trust_env=False)
    resource = create_namespaced_resource(GROUP, VERSION, CLAIM_KIND, CLAIM_PLURAL)
    namespace = "bench-claims"
    client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    watch = BoundWatch(client, resource, namespace)
    watch.thread.start()
    watch.started.wait(30)
    created: dict[str, float] = {}
    errors: list[str] = []
    start = time.monotonic() + 0.5
    cpu_before = cpu_by_group(leaders or {})
    requests_before = api_requests(kc) if leaders else {}

    def create(i: int) -> None:
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        name = f"claim-{i:05d}"
        sent = time.monotonic()
        try:
            client.create(resource(**claim_body(name, namespace)))
            created[name] = sent
        except Exception as err:
            errors.append(f"{name}: {err}")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(claims)))
    last_create = max(created.values(), default=start)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with watch.lock:
            if all(name in watch.bound for name in created):
                break
        time.sleep(0.1)
    cpu_after = cpu_by_group(leaders or {})
    requests_after = api_requests(kc) if leaders else {}
    watch.stop.set()
    with watch.lock:
        bound = dict(watch.bound)
    latencies = [bound[n] - created[n] for n in created if n in bound]
    first = min(created.values(), default=start)
    last_bound = max((bound[n] for n in created if n in bound), default=first)
    return {"claims": claims, "rate": rate, "created": len(created), "errors": errors[:5],
            "create_rate": len(created) / max(last_create - first, 1e-9),
            "bound": len(latencies), "not_bound": sorted(set(created) - set(bound))[:10],
            "p50_s": quantile(latencies, 0.5) if latencies else float("nan"),
            "p99_s": quantile(latencies, 0.99) if latencies else float("nan"),
            "max_s": max(latencies, default=float("nan")),
            "mean_s": statistics.fmean(latencies) if latencies else float("nan"),
            "bound_per_s": len(latencies) / max(last_bound - first, 1e-9),
            "cpu_s": {n: round(cpu_after[n] - cpu_before[n], 2) for n in cpu_after},
            "api_requests": {k: v - requests_before.get(k, 0.0) for k, v in requests_after.items()
                             if v - requests_before.get(k, 0.0) > 0 and
                             not k.startswith("WATCH")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0, help="claims created per second")
    parser.add_argument("--workers", type=int, default=16, help="parallel create calls")
    parser.add_argument("--gpu-nodes", type=int, default=8,
                        help="fake nodes of 8 cards (500 claims of 10%% need 50 cards)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds after the last create to wait for Bound")
    parser.add_argument("--cpu", action="store_true",
                        help="also print each sandbox process's CPU seconds and the API requests "
                        "served during the run")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-bench-claims-") as tmp:
        state, kc = Path(tmp) / "state", Path(tmp) / "kubeconfig"
        timed_egpu("sandbox", "up", "--gpu-nodes", str(args.gpu_nodes), "--kubeconfig",
                   str(kc), "--state-dir", str(state))
        try:
            leaders = None
            if args.cpu:
                from elastic_gpu.devcluster.sandbox import Sandbox

                sandbox = Sandbox.load(state)
                assert sandbox is not None, f"no sandbox state in {state}"
                leaders = {n: h.pid for n, h in sandbox.plane.processes.items()}
            result = run(kc, args.claims, args.rate, args.workers, args.timeout, leaders)
        finally:
            timed_egpu("sandbox", "down", "--state-dir", str(state))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"| claims | target rate | create rate | Bound | p50 | p99 | max | Bound/s |\n"
          f"|---|---|---|---|---|---|---|---|\n"
          f"| {result['claims']} | {result['rate']:.0f}/s | {result['create_rate']:.1f}/s | "
          f"{result['bound']}/{result['created']} | {result['p50_s'] * 1000:.0f} ms | "
          f"{result['p99_s'] * 1000:.0f} ms | {result['max_s'] * 1000:.0f} ms | "
          f"{result['bound_per_s']:.1f} |")
    if args.cpu:
        print("CPU s during the run: " + ", ".join(
            f"{n} {s:.1f}" for n, s in sorted(result["cpu_s"].items(), key=lambda kv: -kv[1])))
        print("API requests during the run (all clients): " + ", ".join(
            f"{k} {v:.0f}" for k, v in sorted(result["api_requests"].items(),
                                               key=lambda kv: -kv[1])))
    if result["not_bound"] or result["errors"]:
        print(f"not Bound (first 10): {result['not_bound']}; create errors: {result['errors']}")


if __name__ == "__main__":
    main()
