"""Packing and throughput, DRA mode beside the extender path, side by side on one control plane.

    .venv/bin/python bench/dra_packing.py --nodes 50 --fill 0.6 --rounds 2

The same kwok nodes (8 cards each) carry both paths' inventory: the GPUDevice objects the
extender reads and this driver's ResourceSlices kube-scheduler's DRA allocator reads. A node is
in one mode in a real cluster; here the variants run one at a time, each round's pods deleted
before the next, so no card is ever held by both. The workload is one seeded sequence of GPU
requests, the same in every variant, sized to `--fill` of the cluster's GPU compute:
40 % shares of 25 % + 8 GiB, 30 % shares of 50 % + 16 GiB, 20 % one whole card, 10 % two.

- `egpu`: kube-scheduler with the extender (deploy/'s stanza: filter, prioritize, bind), pods
  asking `elasticgpu.io/gpu-core` / `gpu-memory` and `nvidia.com/gpu`;
- `dra`: kube-scheduler alone, pods with a ResourceClaimTemplate of class `gpu.elasticgpu.io`
  per shape (`capacity.requests` for the shares, `count` for whole cards);
- `dra-packed`: the same pods with the scheduling gate `elasticgpu.io/dra-placement` the
  webhook puts on them, the extender's DRA allocator placing their claims with our engine
  (issue 41) and lifting the gate, stock kube-scheduler binding them.

Per variant and round: pods/s from the first bind to the last (pods are created first with a
scheduler name nobody serves, as in sched_throughput.py), then the packing of what was bound,
read independently from the API (pods' assignment annotations; claims' allocation results):
cards in use, cards left wholly free, nodes left wholly free, and the most whole cards one node
still has free (the largest whole-card pod that still fits). Both readings are checked for a
card over its capacity. Medians over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from egpu_testing.scenario import create_pods, list_pods, unbound_count
from egpu_testing.workbench import (
    CardUse,
    ExtenderProcess,
    card_use_from_pods,
    extender_kube_scheduler_config,
    overcommitted,
    plain_kube_scheduler_config,
    pod_manifest,
    start_gpu_cluster,
)
from elastic_gpu.agent.dra.slices_api import publish_node_slices
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.allocation import allocated_devices
from elastic_gpu.core.dra.classes import CARD_CLASS, device_classes
from elastic_gpu.core.dra.devices import device_table
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.kube.apply import create_or_update
from elastic_gpu.kube.resources import RESOURCE_CLAIMS

#: (name, percent, memory MiB or None for whole cards, whole cards, weight)
SHAPES = (("quarter", 25, 8192, 0, 40), ("half", 50, 16384, 0, 30),
          ("one", 0, None, 1, 20), ("two", 0, None, 2, 10))
VARIANTS = ("egpu", "dra", "dra-packed")


def workload(nodes: int, fill: float, seed: int) -> list[str]:
    """Shape names in arrival order, summing to about `fill` of the cluster's compute."""
    rng = random.Random(seed)
    names = [s[0] for s in SHAPES]
    weights = [s[4] for s in SHAPES]
    size = {s[0]: (s[1] / 100 if s[2] is not None else s[3]) for s in SHAPES}
    out: list[str] = []
    total, target = 0.0, fill * nodes * 8
    while total < target:
        pick = rng.choices(names, weights)[0]
        out.append(pick)
        total += size[pick]
    return out


def _shape(name: str) -> tuple[int, int | None, int]:
    for s in SHAPES:
        if s[0] == name:
            return s[1], s[2], s[3]
    raise KeyError(name)


def egpu_pod(i: int, shape: str, namespace: str) -> dict[str, Any]:
    percent, memory, whole = _shape(shape)
    limits = ({"nvidia.com/gpu": str(whole)} if memory is None else
              {"elasticgpu.io/gpu-core": str(percent), "elasticgpu.io/gpu-memory": str(memory)})
    return pod_manifest(f"p-{i:05d}", namespace, limits=limits, scheduler_name=namespace)


def claim_template(shape: str, namespace: str) -> dict[str, Any]:
    percent, memory, whole = _shape(shape)
    exactly: dict[str, Any] = {"deviceClassName": CARD_CLASS}
    if memory is None:
        exactly["count"] = whole
    else:
        exactly["capacity"] = {"requests": {"compute": str(percent), "memory": f"{memory}Mi"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": shape, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def dra_pod(i: int, shape: str, namespace: str, gated: bool = False) -> dict[str, Any]:
    pod = pod_manifest(f"p-{i:05d}", namespace, scheduler_name=namespace)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": shape}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    if gated:  # what the webhook's dra_gate mutator adds (the bench runs no webhook)
        pod["spec"]["schedulingGates"] = [{"name": DRA_PLACEMENT_GATE}]
    return pod


def claim_use(kube: Any, namespace: str, nodes: list[Node]) -> dict[tuple[str, int], CardUse]:
    """What the namespace's claims' allocation results say each card carries."""
    tables = {n.name: device_table(n.cards) for n in nodes}
    items, _ = kube.list(RESOURCE_CLAIMS.path(namespace))
    use: dict[tuple[str, int], CardUse] = {}
    for claim in items:
        for node, table in tables.items():
            for device in allocated_devices(claim, node, table):
                key = (node, device.share.index)
                old = use.get(key, CardUse())
                use[key] = CardUse(old.milli + device.share.milli,
                                   old.memory_mib + device.share.memory_mib,
                                   (*old.pods, claim["metadata"]["name"]))
    return use


def packing(use: Mapping[tuple[str, int], CardUse], nodes: list[Node]) -> dict[str, float]:
    busy = {key for key, u in use.items() if u.milli or u.memory_mib}
    free_per_node = [sum(1 for c in n.cards if (n.name, c.index) not in busy) for n in nodes]
    return {"cards in use": len(busy), "cards wholly free": sum(free_per_node),
            "nodes wholly free": sum(1 for f, n in zip(free_per_node, nodes, strict=True)
                                     if f == len(n.cards)),
            "most free cards on a node": max(free_per_node, default=0)}


def run(plane: Any, client: Any, kube: Any, work: Path, nodes: list[Node], variant: str,
        round_: int, shapes: list[str]) -> dict[str, float]:
    name = f"{variant}-{round_}"
    plane.kubectl("create", "namespace", name)
    # the DRA variants on DRA-mode nodes (the allocator watches only those since ce4078e: on
    # unlabelled nodes it found none and handed every pod to kube-scheduler), egpu's on
    # device-plugin nodes (the extender fails its pods on a DRA-mode node)
    plane.kubectl("label", "nodes", "--all", "--overwrite",
                  f"{GPU_MODE_LABEL}=dra" if variant != "egpu" else f"{GPU_MODE_LABEL}-")
    if variant in ("dra", "dra-packed"):
        create_or_update(kube, [claim_template(s[0], name) for s in SHAPES])
        pods = [dra_pod(i, s, name, gated=variant == "dra-packed")
                for i, s in enumerate(shapes)]
    else:
        pods = [egpu_pod(i, s, name) for i, s in enumerate(shapes)]
    create_pods(client, pods)
    extender = None
    if variant in ("egpu", "dra-packed"):
        (port,) = free_ports(1)
        extender = ExtenderProcess(plane.kubeconfig, port, work / f"extender-{name}.log",
                                   scheduler_name=name)
        extender.start(timeout_s=120)
    if variant == "egpu":
        assert extender is not None
        config = extender_kube_scheduler_config(extender.url, name)
    else:
        config = plain_kube_scheduler_config(name)
    handle = plane.start_scheduler(config, name=f"ks-{name}")
    count = len(pods)
    try:
        first = last = None
        previous = 0
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            bound = count - unbound_count(client, name)
            now = time.monotonic()
            if bound and first is None:
                first = now
            if bound != previous:
                last, previous = now, bound
            if bound == count:
                break
            time.sleep(0.1)
    finally:
        handle.stop()
        if extender is not None:
            extender.stop()
    if previous != count or first is None or last is None or last == first:
        raise RuntimeError(f"{variant}: {previous}/{count} pods bound")
    use = (claim_use(kube, name, nodes) if variant != "egpu"
           else card_use_from_pods(list_pods(client, name)))
    problems = overcommitted(use, nodes)
    if problems:
        raise RuntimeError(f"{variant}: cards over capacity: {problems[:5]}")
    result = {"pods/s": count / (last - first), **packing(use, nodes)}
    plane.kubectl("delete", "namespace", name, "--wait=true", timeout_s=900)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--fill", type=float, default=0.6,
                        help="the workload's GPU compute as a fraction of the cluster's")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs of every component) and print it")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    variants = tuple(args.variants.split(","))
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    shapes = workload(args.nodes, args.fill, args.seed)
    print(f"{len(shapes)} pods per variant: " + ", ".join(
        f"{s[0]} {shapes.count(s[0])}" for s in SHAPES), flush=True)
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(tempfile.mkdtemp(prefix="dra-packing-"))
            print(f"work directory: {work}", flush=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dra-packing-")))
        plane, client, nodes = start_gpu_cluster(work, args.nodes, "gpu-node")
        try:
            kube = plane.kube()
            create_or_update(kube, device_classes())
            for node in nodes:
                publish_node_slices(kube, node.name, node.cards)
            results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else tuple(reversed(variants))
                for variant in order:
                    result = run(plane, client, kube, work, nodes, variant, round_, shapes)
                    print(f"round {round_} {variant}: {result}", flush=True)
                    results[variant].append(result)
        finally:
            plane.stop()
    keys = list(results[variants[0]][0])
    print("| variant | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for variant in variants:
        cells = [statistics.median(r[k] for r in results[variant]) for k in keys]
        print(f"| {variant} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
