"""What the extender keeps of API objects, and which changes are worth passing on.

The API worker sends the scheduler process only these fields, and only when one of them
changed: kwok (or a kubelet) updates a bound pod's status several times and a node's status
every few seconds, and none of that moves a card. Every field read by `PodInfo.from_manifest`,
`pod_request_from_manifest`, `app.node_info`, `core.nodeaffinity` and
`gpudevice.card_from_gpudevice` must survive here (tests/unit/scheduler/test_sched_slim.py
checks it on full objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.core.podlife import TERMINAL_PHASES

Obj = dict[str, Any]

__all__ = [
    "TERMINAL_PHASES",
    "ChangeFilter",
    "slim_claim",
    "slim_class",
    "slim_device",
    "slim_elasticgpu",
    "slim_node",
    "slim_pod",
]


def _pick(source: Mapping[str, Any] | None, keys: tuple[str, ...]) -> Obj:
    if not source:
        return {}
    return {k: source[k] for k in keys if k in source}


def _containers(items: Any) -> list[Obj]:
    return [{"name": c.get("name", "?"), "resources": c.get("resources") or {}}
            for c in items or () if isinstance(c, Mapping)]


def _node_affinity(spec: Mapping[str, Any]) -> Obj:
    """Only the required node affinity (the bind's placement check reads it)."""
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node, Mapping) else None
    if required is None:
        return {}
    return {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": required}}}


def _container_states(statuses: Any) -> list[Obj]:
    """Each container status as its name and the kind of its state only (`{"terminated":
    {}}`): what `core.podlife.stopped` reads, without the timestamps that change often."""
    return [{"name": s.get("name"),
             "state": {k: {} for k in (s.get("state") or {}) if isinstance(k, str)}}
            for s in statuses or () if isinstance(s, Mapping)]


def _deleting_status(status: Mapping[str, Any]) -> Obj:
    """A pod being deleted frees its cards once its containers have stopped
    (`core.podlife.stopped`): keep their states, and only then (a running pod's status
    changes would otherwise each be an event)."""
    return {key: _container_states(status.get(key))
            for key in ("containerStatuses", "initContainerStatuses",
                        "ephemeralContainerStatuses") if status.get(key)}


def slim_pod(pod: Mapping[str, Any]) -> Obj:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    deleting = bool(meta.get("deletionTimestamp"))
    out: Obj = {
        "metadata": _pick(meta, ("name", "namespace", "uid", "resourceVersion", "annotations",
                                 "deletionTimestamp")),
        # nodeSelector, required node affinity and tolerations: for the bind's placement check
        "spec": {**_pick(spec, ("nodeName", "priority", "schedulerName", "nodeSelector",
                                "tolerations")),
                 **_node_affinity(spec),
                 "containers": _containers(spec.get("containers"))},
        # Only a terminal phase, or the containers of a pod being deleted stopping, change
        # what a pod holds (`core.podlife.stopped`); Pending -> Running does not, and dropping
        # it spares the scheduler one event per started pod.
        "status": ({"phase": phase} if (phase := status.get("phase")) in TERMINAL_PHASES
                   else _deleting_status(status) if deleting else {}),
    }
    if spec.get("initContainers"):
        out["spec"]["initContainers"] = _containers(spec.get("initContainers"))
    if spec.get("overhead"):
        out["spec"]["overhead"] = spec["overhead"]
    return out


def slim_node(node: Mapping[str, Any]) -> Obj:
    return {"metadata": _pick(node.get("metadata"), ("name", "labels")),
            "spec": _pick(node.get("spec"), ("taints",)),
            "status": _pick(node.get("status"), ("allocatable", "capacity"))}


def slim_device(device: Mapping[str, Any]) -> Obj:
    meta = device.get("metadata") or {}
    return {**{k: v for k, v in device.items() if k != "metadata"},
            "metadata": _pick(meta, ("name", "labels"))}


def slim_elasticgpu(egpu: Mapping[str, Any]) -> Obj:
    """An ElasticGPU: its spec (node, cards, claimRef, ...) and phase; what
    `api.elasticgpu.elasticgpu_from_object` reads. Status messages and conditions are dropped."""
    status = egpu.get("status") or {}
    return {"metadata": _pick(egpu.get("metadata"), ("name", "uid", "resourceVersion")),
            "spec": egpu.get("spec") or {},
            "status": _pick(status, ("phase",))}


def slim_claim(claim: Mapping[str, Any]) -> Obj:
    """An ElasticGPUClaim: spec, phase, and whether it is being deleted (`claim_from_object`)."""
    status = claim.get("status") or {}
    return {"metadata": _pick(claim.get("metadata"), ("name", "namespace", "uid",
                                                      "resourceVersion", "deletionTimestamp")),
            "spec": claim.get("spec") or {},
            "status": _pick(status, ("phase", "elasticGPUName"))}


def slim_class(cls: Mapping[str, Any]) -> Obj:
    """An ElasticGPUClass: its top-level fields (`class_from_object`)."""
    return {"metadata": _pick(cls.get("metadata"), ("name", "uid", "resourceVersion")),
            **_pick(cls, ("provisioner", "parameters", "reclaimPolicy", "egpuBindingMode"))}


def _identity(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "")


def _without_version(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    if "resourceVersion" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}


class ChangeFilter:
    """Drops events that change nothing the scheduler reads.

    A pod's resourceVersion matters while it is unbound (the Binding is sent with it as a
    precondition), so unbound pods always pass; a bound pod's version no longer does.
    """

    def __init__(self) -> None:
        self._last: dict[str, Obj] = {}

    def replace(self, objects: list[Obj]) -> None:
        self._last = {_identity(o): _without_version(o) for o in objects}

    def changed(self, kind: str, obj: Obj) -> bool:
        key = _identity(obj)
        if kind == "DELETED":
            self._last.pop(key, None)
            return True
        bare = _without_version(obj)
        unbound_pod = "spec" in obj and "containers" in obj["spec"] and not obj["spec"].get(
            "nodeName")
        if not unbound_pod and self._last.get(key) == bare:
            return False
        self._last[key] = bare
        return True
