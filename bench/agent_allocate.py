"""Allocate latency of the node agent's device plugins, over real gRPC on a unix socket.

    .venv/bin/python bench/agent_allocate.py [--calls 300] [--background 0,100,100p]

Prints p50/p99 (milliseconds) as a Markdown table, for
- `time-sliced`: kubelet's device IDs are the allocation (no API call): the gRPC round trip
  plus building the container's environment;
- `assigned, B other pods`: the scheduler's assignment is looked up in the API of a real
  kube-apiserver (the development control plane) by a running agent (`Agent` with an API
  client: its inventory published, its pod watch running); B is the number of other pods on
  the node, already served and Running, as on a busy node. `Bp` makes them Pending instead
  (served, but not started yet: the worst case for an Allocate that lists Pending pods).
Each measured call serves a fresh Pending pod created beforehand and deleted afterwards,
outside the timing, so the node holds B + 1 pods during every call.

The script only uses what both the agent before issue 12 (live LIST of all the node's pods,
then a PATCH marking the pod) and after it (live LIST of the node's Pending pods, nothing
written) offer, so one file measures both: run it with either tree first on PYTHONPATH.
The other pods carry the old agent's `elasticgpu.io/allocated` mark, so that the old agent
too skips them as already served.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
from elastic_gpu.agent.deviceplugin.plugin import socket_name
from elastic_gpu.agent.proto import api_pb2, api_pb2_grpc
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.kube.sync import SyncKubeClient

NODE = "bench-node"
CORE = "elasticgpu.io/gpu-core"
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 81920} for _ in range(8)]}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


def stub_for(plugin_dir: Path, resource: str) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{plugin_dir / socket_name(resource)}")
    return channel, api_pb2_grpc.DevicePluginStub(channel)


def allocate(stub: Any, ids: list[str]) -> float:
    request = api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=ids)])
    start = time.perf_counter()
    stub.Allocate(request, timeout=10)
    return time.perf_counter() - start


def bench_time_sliced(calls: int) -> tuple[float, float]:
    plugin_dir = Path(tempfile.mkdtemp(prefix="egpu-bench-"))
    agent = Agent(parse_config({"timeSlicing": {"replicas": 4}, "resources": {"share": []},
                                "healthCheck": {"enabled": False}}),
                  FakeBackend.from_dict(INVENTORY, NODE), NODE, plugin_dir=plugin_dir)
    agent.start()
    try:
        channel, stub = stub_for(plugin_dir, "nvidia.com/gpu")
        ids = [unit.id for unit in agent.snapshot.plans[0].devices]
        for i in range(20):  # warm-up: channel connect, code paths
            allocate(stub, [ids[i % len(ids)]])
        samples = [allocate(stub, [ids[i % len(ids)]]) for i in range(calls)]
        channel.close()
        return percentiles(samples)
    finally:
        agent.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def pod(name: str, card: int, marked: bool) -> dict[str, Any]:
    share = CardShare(card, f"GPU-fake-{NODE}-{card}", 100, 0)
    annotations = {ann.ASSIGNMENT: Assignment(NODE, {"main": (share,)}).to_json(),
                   ann.ASSIGNED_NODE: NODE}
    if marked:
        annotations[ann.ALLOCATED] = json.dumps({"main": [CORE]})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": NODE, "containers": [{
                "name": "main", "image": "bench", "resources": {"limits": {CORE: "10"}}}]}}


def bench_assigned(client: Any, agent_client: SyncKubeClient, calls: int, background: int,
                   running: bool, run: int) -> tuple[float, float]:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    plugin_dir = Path(tempfile.mkdtemp(prefix="egpu-bench-"))
    agent = Agent(parse_config({"healthCheck": {"enabled": False}, "syncSeconds": 3600}),
                  FakeBackend.from_dict(INVENTORY, NODE), NODE, client=agent_client,
                  plugin_dir=plugin_dir)
    agent.start()
    try:
        channel, stub = stub_for(plugin_dir, CORE)
        for i in range(background):
            name = f"bg-{run}-{i}"
            if running:
                # served long ago and running (the old agent's mark says "served" to it)
                client.create(codecs.from_dict(pod(name, i % 8, marked=True)))
                client.patch(Pod.Status, name, {"status": {"phase": "Running"}},
                             namespace="default", patch_type=PatchType.MERGE)
            else:
                # served by this agent just now, not started yet: still Pending
                client.create(codecs.from_dict(pod(name, i % 8, marked=False)))
                allocate(stub, [f"0-{k}" for k in range(10)])
        samples = []
        for i in range(calls + 10):
            name = f"p-{run}-{i}"
            client.create(codecs.from_dict(pod(name, i % 8, marked=False)))
            elapsed = allocate(stub, [f"0-{k}" for k in range(10)])
            # keep the node at `background` + 1 pods (force: no kubelet confirms deletion)
            client.delete(Pod, name, namespace="default", grace_period=0)
            if i >= 10:  # the first ten warm up the channel and the HTTP connection
                samples.append(elapsed)
        channel.close()
        return percentiles(samples)
    finally:
        agent.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
        client.deletecollection(Pod, namespace="default")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--background", default="0,100,100p",
                        help="comma list of other pods on the node, one assigned run each; "
                             "N: Running, Np: Pending")
    args = parser.parse_args()
    rows = [("time-sliced (no API)", *bench_time_sliced(args.calls))]
    from lightkube import codecs

    from egpu_testing.cluster import TestCluster

    with tempfile.TemporaryDirectory(prefix="egpu-bench-cp-") as tmp:
        plane = TestCluster(work_dir=Path(tmp), die_with_parent=True)
        plane.start(scheduler=False, kwok_enabled=False)
        agent_client: SyncKubeClient | None = None
        try:
            client = plane.client()
            agent_client = SyncKubeClient.from_config(plane.kubeconfig, field_manager="egpu-agent")
            ensure_crd(plane.kube())  # what `kubectl apply -f deploy/crds/` does at install time
            capacity = {"cpu": "64", "memory": "512Gi", "pods": "500"}
            client.create(codecs.from_dict({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                "status": {"capacity": capacity, "allocatable": capacity}}))
            for run, spec in enumerate(args.background.split(",")):
                running = not spec.endswith("p")
                background = int(spec.rstrip("p"))
                state = "Running" if running else "Pending"
                label = f"{background} other pods ({state})" if background else "0 other pods"
                rows.append((f"assigned, {label}",
                             *bench_assigned(client, agent_client, args.calls, background,
                                             running, run)))
        finally:
            if agent_client is not None:
                agent_client.close()
            plane.stop()
    print(f"Allocate latency, {args.calls} calls each (ms)\n")
    print("| path | p50 | p99 |\n|---|---:|---:|")
    for name, p50, p99 in rows:
        print(f"| {name} | {p50:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
