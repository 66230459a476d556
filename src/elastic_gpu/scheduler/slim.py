"""What the extender keeps of API objects, and which changes are worth passing on.

The API worker sends the scheduler process only these fields, and only when one of them
changed: kwok (or a kubelet) updates a bound pod's status several times and a node's status
every few seconds, and none of that moves a card. Every field read by `PodInfo.from_manifest`,
`pod_request_from_manifest`, `app.node_info`, `core.nodeaffinity`,
`core.dra.nodemode.extender_binds` and `gpudevice.card_from_gpudevice` must survive here
(tests/unit/scheduler/test_sched_slim.py checks it on full objects).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from elastic_gpu.core.podlife import TERMINAL_PHASES

Obj = dict[str, Any]

__all__ = [
    "TERMINAL_PHASES",
    "ChangeFilter",
    "ListedDevice",
    "ListedNode",
    "ListedPod",
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
    """Each container's name and resources, and an init container's `restartPolicy` (a
    sidecar's requests are summed with the containers', `core.request.is_sidecar`)."""
    return [{"name": c.get("name", "?"), "resources": c.get("resources") or {},
             **({"restartPolicy": c["restartPolicy"]} if "restartPolicy" in c else {})}
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
        # nodeSelector, required node affinity and tolerations: for the bind's placement
        # check; resourceClaims: the bind takes a claim pod on a DRA node (`extender_binds`)
        "spec": {**_pick(spec, ("nodeName", "priority", "schedulerName", "nodeSelector",
                                "tolerations", "resourceClaims")),
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
    for key in ("overhead", "resources"):  # `core.request.pod_host_requests` reads both
        if spec.get(key):
            out["spec"][key] = spec[key]
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


# ------------------------------------------------------ what a list and a watch decode
#
# A list's pages and a watch's events are decoded straight into these shapes
# (`RestClient.list_pages(shape=)`, `RestClient.watch(shape=)`, `apiworker.SHAPES`): only the
# fields the slim forms read are built as Python objects, the rest of the JSON
# (managedFields, a Node's images and conditions, a pod's volumes, status churn) is skipped
# by the decoder. Every shape keeps metadata.resourceVersion: the reflector watches on from
# the newest version an event (a BOOKMARK's too) carried. Each field is UNSET when the object
# lacks it, so the dict the shape turns back into has exactly the keys the object had, and the
# slim function then gives the same result as on the full object
# (tests/unit/scheduler/test_sched_slim.py checks it). Values
# below these fields are `Any`: whatever the API sent, as plain builtins.

class _Shape(msgspec.Struct, omit_defaults=True):
    """A list item's decoded fields; UNSET ones are left out when turned back into a dict."""


class _NamedMeta(_Shape):
    name: Any = msgspec.UNSET
    labels: Any = msgspec.UNSET
    resourceVersion: Any = msgspec.UNSET


class _PodMeta(_Shape):
    name: Any = msgspec.UNSET
    namespace: Any = msgspec.UNSET
    uid: Any = msgspec.UNSET
    resourceVersion: Any = msgspec.UNSET
    annotations: Any = msgspec.UNSET
    deletionTimestamp: Any = msgspec.UNSET


class _Container(_Shape):
    name: Any = msgspec.UNSET
    resources: Any = msgspec.UNSET
    restartPolicy: Any = msgspec.UNSET


class _ContainerStatus(_Shape):
    name: Any = msgspec.UNSET
    state: Any = msgspec.UNSET


class _PodSpec(_Shape):
    nodeName: Any = msgspec.UNSET
    priority: Any = msgspec.UNSET
    schedulerName: Any = msgspec.UNSET
    nodeSelector: Any = msgspec.UNSET
    tolerations: Any = msgspec.UNSET
    resourceClaims: Any = msgspec.UNSET
    affinity: Any = msgspec.UNSET
    #: null in a BOOKMARK event's Pod (`{"spec": {"containers": null}}`: Go's nil slice, no
    #: omitempty): refusing it failed the pods watch at every bookmark, and each failure cost
    #: a relist of every pod
    containers: list[_Container] | msgspec.UnsetType | None = msgspec.UNSET
    initContainers: list[_Container] | msgspec.UnsetType | None = msgspec.UNSET
    overhead: Any = msgspec.UNSET
    resources: Any = msgspec.UNSET


class _PodStatus(_Shape):
    phase: Any = msgspec.UNSET
    containerStatuses: list[_ContainerStatus] | msgspec.UnsetType = msgspec.UNSET
    initContainerStatuses: list[_ContainerStatus] | msgspec.UnsetType = msgspec.UNSET
    ephemeralContainerStatuses: list[_ContainerStatus] | msgspec.UnsetType = msgspec.UNSET


class ListedPod(_Shape):
    """What `slim_pod` reads of a pod."""

    metadata: _PodMeta | msgspec.UnsetType = msgspec.UNSET
    spec: _PodSpec | msgspec.UnsetType = msgspec.UNSET
    status: _PodStatus | msgspec.UnsetType = msgspec.UNSET


class _NodeSpec(_Shape):
    taints: Any = msgspec.UNSET


class _NodeStatus(_Shape):
    allocatable: Any = msgspec.UNSET
    capacity: Any = msgspec.UNSET


class ListedNode(_Shape):
    """What `slim_node` reads of a Node."""

    metadata: _NamedMeta | msgspec.UnsetType = msgspec.UNSET
    spec: _NodeSpec | msgspec.UnsetType = msgspec.UNSET
    status: _NodeStatus | msgspec.UnsetType = msgspec.UNSET


class ListedDevice(_Shape):
    """What `slim_device` reads of a GPUDevice: all but its metadata's other fields (the
    CRD's schema has no other top-level fields)."""

    apiVersion: Any = msgspec.UNSET
    kind: Any = msgspec.UNSET
    metadata: _NamedMeta | msgspec.UnsetType = msgspec.UNSET
    spec: Any = msgspec.UNSET
    status: Any = msgspec.UNSET


def _identity(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "")


_digest_encoder = msgspec.msgpack.Encoder(order="deterministic")


def _digest(obj: Obj) -> bytes:
    """A fingerprint of what the scheduler reads of `obj` (its slim form less the
    resourceVersion): 16 bytes instead of a copy of the object, so the filter's memory does
    not grow with the objects' size (a slim pod is ~1-2 KiB as Python objects; 120,000 of
    them were most of the API worker's peak). A collision (2^-128 a pair) would drop one
    change; the encoding is canonical (keys sorted), so equal objects always agree."""
    meta = obj.get("metadata") or {}
    if "resourceVersion" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    return hashlib.blake2b(_digest_encoder.encode(obj), digest_size=16).digest()


class ChangeFilter:
    """Drops events that change nothing the scheduler reads; it remembers a digest of each
    object's slim form (`_digest`), not the object.

    A pod's resourceVersion matters while it is unbound (the Binding is sent with it as a
    precondition), so unbound pods always pass; a bound pod's version no longer does.

    A list arrives page by page: `begin_list`, `listed(page)` for each, `end_list`; what
    was remembered before is replaced only at the end (`replace` is the three at once).
    """

    def __init__(self) -> None:
        self._last: dict[str, bytes] = {}
        self._listing: dict[str, bytes] | None = None

    def replace(self, objects: list[Obj]) -> None:
        self.begin_list()
        self.listed(objects)
        self.end_list()

    def begin_list(self) -> None:
        self._listing = {}

    def listed(self, objects: list[Obj]) -> None:
        if self._listing is None:
            raise RuntimeError("listed() outside a list: begin_list() first")
        for obj in objects:
            self._listing[_identity(obj)] = _digest(obj)

    def end_list(self) -> None:
        if self._listing is None:
            raise RuntimeError("end_list() outside a list: begin_list() first")
        self._last, self._listing = self._listing, None

    def changed(self, kind: str, obj: Obj) -> bool:
        key = _identity(obj)
        if kind == "DELETED":
            self._last.pop(key, None)
            return True
        digest = _digest(obj)
        unbound_pod = "spec" in obj and "containers" in obj["spec"] and not obj["spec"].get(
            "nodeName")
        if not unbound_pod and self._last.get(key) == digest:
            return False
        self._last[key] = digest
        return True
