"""Pods and inventories for exercising the extender: tests, benchmarks and the sandbox.

Pod manifests in every request style users bring (ours, gpu-manager's, nano-gpu's, whole
cards, MIG), and the state fed directly from core `Node`s, as the reflectors would feed it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.model import Node
from elastic_gpu.k8s.gpudevice import object_name
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState

#: One example per request style: name -> container resources (limits).
STYLES: Mapping[str, Mapping[str, str]] = {
    "canonical": {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "8192"},
    "vcuda": {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-memory": "16"},
    "nano": {"nano-gpu/gpu-percent": "25"},
    "whole": {"nvidia.com/gpu": "2"},
    "canonical-whole": {"elasticgpu.io/gpu-core": "100"},
    "mig": {"nvidia.com/mig-3g.40gb": "1"},
}


def pod_manifest(name: str, namespace: str = "default", *,
                 containers: Mapping[str, Mapping[str, str]] | None = None,
                 limits: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None, uid: str | None = None,
                 scheduler_name: str | None = None, priority: int | None = None,
                 node_policy: str | None = None, card_policy: str | None = None
                 ) -> dict[str, Any]:
    """A pod; `containers` maps container name -> GPU limits (or `limits` for one container)."""
    if containers is None:
        containers = {"main": dict(limits or {})}
    notes = dict(annotations or {})
    if node_policy:
        notes[ann.NODE_POLICY] = node_policy
    if card_policy:
        notes[ann.CARD_POLICY] = card_policy
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if notes:
        meta["annotations"] = notes
    if uid is not None:
        meta["uid"] = uid
    spec: dict[str, Any] = {
        "containers": [{"name": cname, "image": "busybox",
                        "resources": {"limits": dict(res), "requests": dict(res)}}
                       for cname, res in containers.items()],
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def feed_nodes(state: SchedulerState, nodes: Iterable[Node]) -> None:
    """Put inventory into the state the way the node and GPUDevice reflectors do."""
    node_list = list(nodes)
    state.replace_nodes(NodeInfo(n.name, n.cpu_milli, n.memory_mib, dict(n.labels))
                        for n in node_list)
    state.replace_devices((object_name(n.name, c.index), n.name, c)
                          for n in node_list for c in n.cards)


def ready_state(nodes: Iterable[Node], state: SchedulerState | None = None,
                pods: Iterable[Mapping[str, Any]] = ()) -> SchedulerState:
    state = state or SchedulerState()
    feed_nodes(state, nodes)
    state.replace_pods(pods)
    for source in sorted(state.required_sources):
        state.mark_synced(source)
    return state
