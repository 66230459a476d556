"""Admission latency of `egpu webhook` on the real kube-apiserver (issue 14, must-show 5).

    PYTHONPATH=src:tests .venv/bin/python bench/webhook_latency.py --pods 400 --reviews 3000

Starts etcd + kube-apiserver (no scheduler, no controller manager) and `egpu webhook`
registered with its real scope, then:
1. creates `--pods` GPU pods (vcuda-core 50 / vcuda-memory 15, the gpusharing seed), one at a
   time, with the webhook, and as many with the configurations deleted: the client-side create
   time with and without admission by the webhook;
2. reads kube-apiserver's `apiserver_admission_webhook_admission_duration_seconds` for the
   mutating and validating webhook (its buckets are 5, 25, 100 ms, ...: it can say how many
   calls took at most 5 ms, and the mean, not a finer quantile);
3. reads the webhook's own `elasticgpu_webhook_request_duration_seconds` histogram (request
   read to answer; buckets from 0.1 ms);
4. posts `--reviews` AdmissionReviews straight to /mutate over one keep-alive HTTPS connection
   and times each round trip exactly (TLS and HTTP on loopback included).
Prints a Markdown table.

With `--claims` (issue #15) the pods are the Elastic GPU seed README's pod naming an
ElasticGPUClaim created beforehand (the CRDs installed first): each is checked against the
claim (from the webhook's watch: a cache hit, no API call; the table's last line counts the
lookups by source) and given the claim's resources.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from egpu_testing.cluster import TestCluster
from egpu_testing.webhook import WebhookProcess, insecure_context
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports

SEED = {"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "15"}


CLAIM = "bench-claim"


def pod(name: str, namespace: str, claim: bool = False) -> dict[str, Any]:
    if claim:
        import yaml

        from egpu_testing.seed import seed_pod

        obj: dict[str, Any] = yaml.safe_load(seed_pod(name, CLAIM))
        obj["metadata"]["namespace"] = namespace
        return obj
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": dict(SEED)}}]}}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def histogram(text: str, metric: str, match: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets [(le, count)], sum, count) of the samples whose labels contain
    `match`, summed over label sets."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        found = re.match(rf"^{metric}_(bucket|sum|count)\{{([^}}]*)\}} (\S+)$", line)
        if not found or match not in found[2]:
            continue
        kind, labels, value = found[1], found[2], float(found[3])
        if kind == "bucket":
            le = re.search(r'le="([^"]+)"', labels)
            if le:
                bound = float("inf") if le[1] == "+Inf" else float(le[1])
                buckets[bound] = buckets.get(bound, 0.0) + value
        elif kind == "sum":
            total += value
        else:
            count += value
    return sorted(buckets.items()), total, count


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, cumulative
    return lower


def at_most(buckets: list[tuple[float, float]], bound: float) -> float:
    total = buckets[-1][1] if buckets else 0.0
    within = next((c for b, c in buckets if b >= bound - 1e-12), total)
    return within / total if total else float("nan")


def create_timed(plane: ControlPlane, namespace: str, prefix: str, n: int,
                 claim: bool = False) -> list[float]:
    from lightkube import codecs

    client = plane.client()
    times = []
    for i in range(n):
        obj = codecs.from_dict(pod(f"{prefix}-{i}", namespace, claim))
        start = time.perf_counter()
        client.create(obj)
        times.append(time.perf_counter() - start)
    return times


def post_timed(port: int, n: int, claim: bool = False) -> list[float]:
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "bench", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "operation": "CREATE", "namespace": "bench",
                                   "object": pod("p", "bench", claim)}}).encode()
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=insecure_context())
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        times.append(time.perf_counter() - start)
        assert answer["response"]["allowed"] and answer["response"]["patch"]
    conn.close()
    return times


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--reviews", type=int, default=3000)
    parser.add_argument("--claims", action="store_true",
                        help="pods naming an ElasticGPUClaim (the seed README's)")
    args = parser.parse_args()
    claim = bool(args.claims)
    with tempfile.TemporaryDirectory(prefix="egpu-bench-webhook-") as tmp:
        plane = TestCluster(work_dir=Path(tmp) / "k8s", controller_manager=False)
        plane.start(scheduler=False, kwok_enabled=False)
        (port,) = free_ports(1)
        hook = WebhookProcess(plane.kubeconfig, port, Path(tmp) / "webhook.log",
                              name="elastic-gpu-webhook", namespace="elastic-gpu")
        try:
            if claim:
                from egpu_testing.seed import seed_claim
                from elastic_gpu.kube.crds import install_elasticgpu_crds

                install_elasticgpu_crds(plane.kube())
            hook.start()
            plane.kubectl("create", "namespace", "bench")
            if claim:
                plane.kubectl("create", "-n", "bench", "-f", "-", input=seed_claim(CLAIM))
                time.sleep(1)  # the webhook's watch delivers it
            create_timed(plane, "bench", "warm", 20, claim)  # connections, caches
            with_hook = create_timed(plane, "bench", "with", args.pods, claim)
            apiserver = plane.kubectl("get", "--raw", "/metrics").stdout
            server = hook.get("/metrics")[1]
            direct = post_timed(port, args.reviews, claim)
            lookups = {source: hook.metric("elasticgpu_webhook_claim_lookups_total",
                                           f'source="{source}"') for source in ("cache", "api")}
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                plane.kubectl("delete", kind, "elastic-gpu-webhook")
            time.sleep(2)  # the apiserver's informer drops the configurations
            without = create_timed(plane, "bench", "without", args.pods, claim)
        finally:
            hook.stop()
            plane.stop()
    rows = [("pod create, client side, with the webhook", with_hook),
            ("pod create, client side, without it", without),
            ("/mutate round trip, one keep-alive HTTPS connection", direct)]
    print(f"{args.pods} pods created one at a time; {args.reviews} reviews posted\n")
    print("| what | p50 ms | p99 ms | mean ms |")
    print("|---|---|---|---|")
    for what, values in rows:
        print(f"| {what} | {ms(statistics.median(values))} | {ms(quantile(values, 0.99))} | "
              f"{ms(statistics.fmean(values))} |")
    metric = "apiserver_admission_webhook_admission_duration_seconds"
    for name in ("pods.mutate.elasticgpu.io", "pods.validate.elasticgpu.io"):
        buckets, total, count = histogram(apiserver, metric, f'name="{name}"')
        print(f"| kube-apiserver {metric}{{name={name}}} ({count:.0f} calls) | "
              f"{ms(bucket_quantile(buckets, 0.5))} (bucket est.) | "
              f"{ms(bucket_quantile(buckets, 0.99))} (bucket est.) | "
              f"{ms(total / count if count else float('nan'))}; "
              f"{100 * at_most(buckets, 0.005):.1f}% ≤ 5 ms |")
    for webhook in ("mutate", "validate"):
        buckets, total, count = histogram(server, "elasticgpu_webhook_request_duration_seconds",
                                          f'webhook="{webhook}"')
        print(f"| webhook elasticgpu_webhook_request_duration_seconds{{webhook={webhook}}} "
              f"({count:.0f}) | {ms(bucket_quantile(buckets, 0.5))} (bucket est.) | "
              f"{ms(bucket_quantile(buckets, 0.99))} (bucket est.) | "
              f"{ms(total / count if count else float('nan'))} |")
    if claim:
        print(f"\nclaim lookups: {lookups['cache']:.0f} from the watch cache, "
              f"{lookups['api']:.0f} live reads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
