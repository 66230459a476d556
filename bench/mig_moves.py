"""The MIG adapter on `egpu sandbox up --cluster` (issue 16): how long a move and a move back
take, and what the webhook's live rule read costs a MIG pod.

    .venv/bin/python bench/mig_moves.py [--runs 10] [--reads 200]

One sandbox (one A100-80GB node carved [1g.10gb, 2g.20gb], the whole system as `up` runs it).
Each run, in a fresh namespace: a blocker pod takes the 1g.10gb; a bare pod asking 1g.10gb is
created, and timed until it is placed on 2g.20gb (moved: rule, delete, re-create, scheduled);
the blocker is deleted, and the pod timed until it is placed on 1g.10gb again (moved back).
Then `RuleCache.fetch` (the list of one namespace's MIGSubstitutions the webhook makes for
each MIG pod at /mutate) timed `--reads` times against the same apiserver, with one rule in the
namespace. Prints medians (and the 90th percentile) as a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from egpu_testing.sandbox import egpu, kubectl, kubectl_run

CLUSTER = """\
nodeGroups:
- {name: mig, count: 1, gpus: 1, model: A100-SXM4-80GB, memoryMiB: 81920, mig: [1g.10gb, 2g.20gb]}
"""


def pod(name: str, profile: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                           "name": "main", "image": "x",
                           "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}})


def placed_on(kc: Path, namespace: str, name: str, profile: str) -> bool:
    got = kubectl_run(kc, "get", "pod", name, "-n", namespace, "-o", "json")
    if got.returncode != 0:
        return False
    obj: dict[str, Any] = json.loads(got.stdout)
    limits = obj["spec"]["containers"][0]["resources"]["limits"]
    return bool(obj["spec"].get("nodeName")) and f"nvidia.com/mig-{profile}" in limits \
        and not obj["metadata"].get("deletionTimestamp")


def wait(kc: Path, namespace: str, name: str, profile: str, timeout_s: float = 60) -> float:
    start = time.perf_counter()
    while not placed_on(kc, namespace, name, profile):
        if time.perf_counter() - start > timeout_s:
            raise SystemExit(f"{name} not on {profile} after {timeout_s} s")
        time.sleep(0.05)
    return time.perf_counter() - start


def one_run(kc: Path, i: int) -> tuple[float, float]:
    ns = f"bench-mig-{i}"
    kubectl(kc, "create", "namespace", ns)
    kubectl(kc, "create", "-n", ns, "-f", "-", input=pod("blocker", "1g.10gb"))
    wait(kc, ns, "blocker", "1g.10gb")
    kubectl(kc, "create", "-n", ns, "-f", "-", input=pod("train", "1g.10gb"))
    moved = wait(kc, ns, "train", "2g.20gb")
    kubectl(kc, "delete", "pod", "blocker", "-n", ns, "--wait=false")
    back = wait(kc, ns, "train", "1g.10gb")
    kubectl(kc, "delete", "namespace", ns, "--wait=true")
    return moved, back


async def live_reads(kc: Path, reads: int) -> list[float]:
    from elastic_gpu.kube.kubeconfig import async_client
    from elastic_gpu.webhook.migrules import RuleCache

    kubectl(kc, "create", "namespace", "bench-mig-reads")
    kubectl(kc, "create", "-n", "bench-mig-reads", "-f", "-", input=json.dumps({
        "apiVersion": "elasticgpu.io/v1alpha", "kind": "MIGSubstitution",
        "metadata": {"name": "r"}, "spec": {"selector": {"podName": "p"},
                                            "fromProfile": "1g.10gb", "toProfile": "2g.20gb"}}))
    cache = RuleCache()
    cache.client = async_client(kc, field_manager="bench-mig")
    took = []
    try:
        for _ in range(reads):
            start = time.perf_counter()
            rules = await cache.fetch("bench-mig-reads")
            took.append(time.perf_counter() - start)
            assert len(rules) == 1
    finally:
        await cache.client.close()
    return took


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.9) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-bench-mig-") as tmp:
        state, kc = Path(tmp) / "state", Path(tmp) / "kubeconfig"
        (Path(tmp) / "cluster.yaml").write_text(CLUSTER)
        up = egpu("sandbox", "up", "--cluster", str(Path(tmp) / "cluster.yaml"),
                  "--state-dir", str(state), "--kubeconfig", str(kc), timeout=300)
        if up.returncode != 0:
            raise SystemExit(up.stderr + up.stdout)
        try:
            runs = [one_run(kc, i) for i in range(args.runs)]
            reads = asyncio.run(live_reads(kc, args.reads))
        finally:
            egpu("sandbox", "down", "--state-dir", str(state))
    moved = [m for m, _ in runs]
    back = [b for _, b in runs]
    print("| what | runs | median | p90 |")
    print("|---|---:|---:|---:|")
    print(f"| pending bare pod created -> placed on 2g.20gb (moved) | {len(moved)} | "
          f"{statistics.median(moved):.2f} s | {p90(moved):.2f} s |")
    print(f"| blocker deleted -> placed on 1g.10gb again (moved back) | {len(back)} | "
          f"{statistics.median(back):.2f} s | {p90(back):.2f} s |")
    print(f"| webhook's live rule read (one namespace list) | {len(reads)} | "
          f"{statistics.median(reads) * 1e3:.2f} ms | {p90(reads) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
