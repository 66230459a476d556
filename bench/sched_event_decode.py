"""What one watch event costs the extender's API worker to decode and slim, before and after
watches decode into the slim shapes (issue 39, "Cost per pod"), side by side in one run:
the same event lines, decoded whole then slimmed (`WatchDecoder()`, as every watch did) and
decoded straight into the feed's shape then slimmed (`WatchDecoder(SHAPES[feed])`).

    PYTHONPATH=src .venv/bin/python bench/sched_event_decode.py [--events 20000] [--rounds 7]

The events are as kube-apiserver sends them for a kwok cluster's GPU pod (managedFields of
its three writers, a projected token volume, the default tolerations, four conditions) and a
kwok node (its heartbeat conditions, addresses, nodeInfo, a few images). Prints CPU µs per
event, the median of the rounds (each round decodes `--events` lines of each kind, the two
ways interleaved).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec

from elastic_gpu.kube.transport import WatchDecoder
from elastic_gpu.scheduler.apiworker import SHAPES
from elastic_gpu.scheduler.slim import slim_node, slim_pod

STAMP = "2026-12-06T02:00:00Z"


def _managed(manager: str, operation: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "apiVersion": "v1", "time": STAMP,
            "fieldsType": "FieldsV1", "fieldsV1": fields}


def pod_event(i: int) -> bytes:
    """A bound, running GPU pod's MODIFIED event."""
    name = f"gpu-pod-{i}"
    pod = {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": name, "namespace": "default", "uid": f"0d6c1a4e-{i:08d}-4b9f-9c1e-7f0a5c3e",
            "resourceVersion": str(100_000 + i), "creationTimestamp": STAMP,
            "labels": {"app": "train", "job": f"job-{i % 50}"},
            "annotations": {
                "elasticgpu.io/assignment": '{"node":"kwok-node-7","containers":{"main":'
                                            '[{"index":2,"uuid":"GPU-7-2","core":250,'
                                            '"memory":4096}]}}',
                "elasticgpu.io/assigned-node": "kwok-node-7"},
            "managedFields": [
                _managed("kubectl-create", "Update", {"f:metadata": {"f:labels": {
                    ".": {}, "f:app": {}, "f:job": {}}}, "f:spec": {
                    "f:containers": {'k:{"name":"main"}': {
                        ".": {}, "f:command": {}, "f:image": {}, "f:imagePullPolicy": {},
                        "f:name": {}, "f:resources": {".": {}, "f:limits": {
                            ".": {}, "f:elasticgpu.io/gpu-core": {},
                            "f:elasticgpu.io/gpu-memory": {}}, "f:requests": {
                            ".": {}, "f:cpu": {}, "f:memory": {}}},
                        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                    "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                    "f:schedulerName": {}, "f:securityContext": {},
                    "f:terminationGracePeriodSeconds": {}}}),
                _managed("egpu-scheduler", "Update", {"f:metadata": {"f:annotations": {
                    ".": {}, "f:elasticgpu.io/assigned-node": {},
                    "f:elasticgpu.io/assignment": {}}}}),
                _managed("kwok", "Update", {"f:status": {"f:conditions": {
                    'k:{"type":"ContainersReady"}': {".": {}, "f:status": {}, "f:type": {}},
                    'k:{"type":"Initialized"}': {".": {}, "f:status": {}, "f:type": {}},
                    'k:{"type":"Ready"}': {".": {}, "f:status": {}, "f:type": {}}},
                    "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {},
                    "f:podIPs": {".": {}, 'k:{"ip":"10.0.0.7"}': {".": {}, "f:ip": {}}},
                    "f:startTime": {}}}),
            ]},
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [
                    {"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}],
                "defaultMode": 420}}],
            "containers": [{
                "name": "main", "image": "busybox", "command": ["sleep", "infinity"],
                "resources": {"limits": {"elasticgpu.io/gpu-core": "25",
                                         "elasticgpu.io/gpu-memory": "4096"},
                              "requests": {"cpu": "500m", "memory": "1Gi",
                                           "elasticgpu.io/gpu-core": "25",
                                           "elasticgpu.io/gpu-memory": "4096"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "Always"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "serviceAccount": "default", "nodeName": "kwok-node-7", "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                            "lastTransitionTime": STAMP}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "hostIP": "10.0.0.7", "hostIPs": [{"ip": "10.0.0.7"}], "podIP": "10.0.0.7",
            "podIPs": [{"ip": "10.0.0.7"}], "startTime": STAMP,
            "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": STAMP}},
                                   "lastState": {}, "ready": True, "restartCount": 0,
                                   "image": "busybox", "imageID": "", "started": True}],
            "qosClass": "Burstable"}}
    return msgspec.json.encode({"type": "MODIFIED", "object": pod})


def node_event(i: int) -> bytes:
    """A kwok node's heartbeat MODIFIED event."""
    name = f"kwok-node-{i}"
    node = {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {
            "name": name, "uid": f"5b2e9d71-{i:08d}-4c0a-8e6f-2d9b7a1c", "resourceVersion":
            str(200_000 + i), "creationTimestamp": STAMP,
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                       "kubernetes.io/os": "linux", "kubernetes.io/role": "agent",
                       "node-role.kubernetes.io/agent": "", "type": "kwok",
                       "elasticgpu.io/gpu-model": "A100"},
            "annotations": {"kwok.x-k8s.io/node": "fake",
                            "node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [
                _managed("kubectl-create", "Update", {"f:metadata": {"f:annotations": {
                    ".": {}, "f:kwok.x-k8s.io/node": {}}, "f:labels": {
                    ".": {}, "f:type": {}, "f:elasticgpu.io/gpu-model": {}}}}),
                _managed("kwok", "Update", {"f:status": {"f:allocatable": {
                    ".": {}, "f:cpu": {}, "f:memory": {}, "f:pods": {},
                    "f:elasticgpu.io/gpu-core": {}, "f:elasticgpu.io/gpu-memory": {}},
                    "f:capacity": {".": {}, "f:cpu": {}, "f:memory": {}, "f:pods": {}},
                    "f:conditions": {}, "f:daemonEndpoints": {}, "f:nodeInfo": {}}})]},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake",
                             "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110",
                         "elasticgpu.io/gpu-core": "800", "elasticgpu.io/gpu-memory": "655360"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110",
                            "elasticgpu.io/gpu-core": "800",
                            "elasticgpu.io/gpu-memory": "655360"},
            "conditions": [{"type": t, "status": s, "lastHeartbeatTime": STAMP,
                            "lastTransitionTime": STAMP, "reason": r, "message": m}
                           for t, s, r, m in (
                               ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                               ("MemoryPressure", "False", "KubeletHasSufficientMemory",
                                "kubelet has sufficient memory available"),
                               ("DiskPressure", "False", "KubeletHasNoDiskPressure",
                                "kubelet has no disk pressure"),
                               ("PIDPressure", "False", "KubeletHasSufficientPID",
                                "kubelet has sufficient PID available"),
                               ("NetworkUnavailable", "False", "RouteCreated",
                                "RouteController created a route"))],
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10247}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "",
                         "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                         "kubeletVersion": "fake", "kubeProxyVersion": "fake",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": [f"registry.example.com/img-{k}@sha256:{'0' * 64}"],
                        "sizeBytes": 1_000_000 * (k + 1)} for k in range(3)]}}
    return msgspec.json.encode({"type": "MODIFIED", "object": node})


def per_event_us(lines: list[bytes], decode: WatchDecoder,
                 slim: Callable[[dict[str, Any]], dict[str, Any]]) -> float:
    """CPU µs per event to decode and slim each of `lines` (process time: what the worker
    spends, not what other programs on a busy box take from it)."""
    started = time.process_time()
    for line in lines:
        slim(decode(line)[1])
    return (time.process_time() - started) / len(lines) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for feed, make, slim in (("pods", pod_event, slim_pod), ("nodes", node_event, slim_node)):
        lines = [make(i) for i in range(args.events)]
        whole = WatchDecoder()
        shaped = WatchDecoder(SHAPES[feed])
        assert slim(whole(lines[0])[1]) == slim(shaped(lines[0])[1])  # the same slim object
        # interleaved, so that a noisy stretch of the machine hits both
        before, after = [], []
        for _ in range(args.rounds):
            before.append(per_event_us(lines, whole, slim))
            after.append(per_event_us(lines, shaped, slim))
        b, a = statistics.median(before), statistics.median(after)
        print(f"{feed[:-1]} event ({len(lines[0])} bytes): decoded whole then slimmed "
              f"{b:.2f} µs, decoded into its shape then slimmed {a:.2f} µs "
              f"({a / b:.2f}x; median of {args.rounds} rounds of {args.events})")


if __name__ == "__main__":
    main()
