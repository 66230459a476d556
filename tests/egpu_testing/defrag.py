"""Doubles for the defragmentation controller's round in unit tests: informers that hold a
fixed list of objects, and a client that records evictions (policy/v1 on pods/eviction) and
answers 429 for the pods a test names, as a PodDisruptionBudget would. The round's decisions
are tested against these; the real API server's behaviour is the integration test's
(tests/integration/controller/test_defragctl_sandbox.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.api import gpudevice
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.mig.layout import layout_starts
from elastic_gpu.core.model import Card, MigInstance
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.errors import ApiError, TooManyRequests
from elastic_gpu.kube.informer import Handler

MEMORY_MIB = 81920


class StaticInformer:
    def __init__(self) -> None:
        self.objects: list[dict[str, Any]] = []

    def items(self) -> list[dict[str, Any]]:
        return list(self.objects)

    def add_handler(self, handler: Handler) -> None:
        del handler


class StaticInformers:
    def __init__(self) -> None:
        self.informers: dict[str, StaticInformer] = {}

    def informer(self, path: str, name: str, *, missing_ok: bool = False) -> StaticInformer:
        del name, missing_ok
        return self.informers.setdefault(path, StaticInformer())


class EvictionClient:
    """`create` of pods/eviction: recorded, or 429 for a pod named in `refuse`; `patch` of a
    pod (the reservation): recorded, or refused with `patch_error` when a test sets one."""

    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.refused: list[str] = []
        self.refuse: set[str] = set()
        self.patched: list[tuple[str, Mapping[str, Any]]] = []
        self.patch_error: ApiError | None = None
        #: every write in order: ("patch", pod key) and ("evict", pod key)
        self.writes: list[tuple[str, str]] = []

    async def patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        parts = path.rstrip("/").split("/")
        assert parts[-2] == "pods", path
        key = f"{parts[-3]}/{parts[-1]}"
        if self.patch_error is not None:
            raise self.patch_error
        self.patched.append((key, patch))
        self.writes.append(("patch", key))
        return {}

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        assert path.endswith("/eviction") and obj["kind"] == "Eviction", path
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if key in self.refuse:
            self.refused.append(key)
            raise TooManyRequests(429, "TooManyRequests",
                                  "Cannot evict pod as it would violate the pod's disruption "
                                  "budget.")
        self.evicted.append(key)
        self.writes.append(("evict", key))
        return {}


def node_objects(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Node and the GPUDevice of its one A100-80GB card."""
    card = Card(0, f"GPU-{name}", "A100-SXM4-80GB", MEMORY_MIB)
    return ({"metadata": {"name": name},
             "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}},
            gpudevice.card_to_object(name, card))


def gpu_pod(name: str, *, percent: int | None, node: str = "", namespace: str = "ml",
            owner: str | None = "ReplicaSet", movable: bool = True, priority: int = 0
            ) -> dict[str, Any]:
    """A pod of `percent` of a card (None: one whole card), placed on `node`'s card 0 with the
    assignment its Binding would write, or (no node) Pending and Unschedulable."""
    limits = {"nano-gpu/gpu-percent": str(percent)} if percent else {"nvidia.com/gpu": "1"}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                            "creationTimestamp": "2026-11-28T20:00:00Z", "labels": {},
                            "annotations": {}}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-rs", "uid": f"rs-{name}",
                                    "controller": True}]
    if movable:
        meta["labels"][ann.MOVABLE_LABEL] = "true"
    spec: dict[str, Any] = {"priority": priority, "containers": [
        {"name": "main", "resources": {"limits": limits}}]}
    status: dict[str, Any] = {"phase": "Pending"}
    if node:
        milli = (percent or 100) * 10
        share = CardShare(0, f"GPU-{node}", milli, MEMORY_MIB * milli // 1000)
        meta["annotations"][ann.ASSIGNMENT] = Assignment(node, {"main": (share,)}).to_json()
        meta["annotations"][ann.ASSIGNED_NODE] = node
        spec["nodeName"] = node
        status = {"phase": "Running"}
    else:
        status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": status}


def mig_node_objects(name: str, profiles: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Node and the GPUDevice of its one A100-80GB card carved into `profiles` (instances
    `MIG-<name>-<k>`)."""
    parsed = [MigProfile.parse(text) for text in profiles]
    starts = layout_starts("A100-SXM4-80GB", parsed)
    instances = [MigInstance(profile, f"MIG-{name}-{k}", start)
                 for k, (profile, start) in enumerate(zip(parsed, starts, strict=True))]
    card = Card(0, f"GPU-{name}", "A100-SXM4-80GB", MEMORY_MIB, mig=tuple(instances))
    return ({"metadata": {"name": name},
             "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}},
            gpudevice.card_to_object(name, card))


def mig_pod(name: str, *, profile: str, count: int = 1, node: str = "",
            instances: tuple[int, ...] = (), owner: str | None = "ReplicaSet") -> dict[str, Any]:
    """A pod asking `count` instances of `profile`, placed on `node`'s instances `instances`
    (as `mig_node_objects` names them) with the assignment its Binding would write, or (no
    node) Pending and Unschedulable."""
    pod = gpu_pod(name, percent=None, node="", owner=owner)
    pod["spec"]["containers"][0]["resources"]["limits"] = {f"nvidia.com/mig-{profile}": str(count)}
    if node:
        memory = MigProfile.parse(profile).memory_gb * 1024
        shares = tuple(CardShare(0, f"GPU-{node}", 0, memory, profile, f"MIG-{node}-{k}")
                       for k in instances)
        pod["metadata"]["annotations"][ann.ASSIGNMENT] = Assignment(
            node, {"main": shares}).to_json()
        pod["metadata"]["annotations"][ann.ASSIGNED_NODE] = node
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod
