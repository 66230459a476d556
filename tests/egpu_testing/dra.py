"""ResourceClaims as kube-scheduler leaves them, for the DRA kubelet plugin's tests: the
allocation results of the driver `gpu.elasticgpu.io` and the pod reservation; and what the
plugin's CDI spec sets, read back. Claims and gated pods to create, for the allocator's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.devices import DRIVER


def result(node: str, device: str, request: str = "gpu", *,
           consumed: Mapping[str, str] | None = None, share_id: str | None = None,
           driver: str = DRIVER) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": node, "device": device}
    if consumed is not None:
        out["consumedCapacity"] = dict(consumed)
    if share_id is not None:
        out["shareID"] = share_id
    return out


def allocation(node: str, results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"devices": {"results": list(results)},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


def reserved_for(pod: str = "p", uid: str = "pod-uid") -> list[dict[str, Any]]:
    return [{"resource": "pods", "name": pod, "uid": uid}]


def claim_object(name: str, namespace: str, uid: str, node: str,
                 results: Sequence[Mapping[str, Any]] | None, *,
                 reserved: bool = True) -> dict[str, Any]:
    """A ResourceClaim read back from the API: allocated with `results` (None: not allocated),
    reserved for a pod unless told not to."""
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = allocation(node, results)
    if reserved:
        status["reservedFor"] = reserved_for()
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.elasticgpu.io"}}]}},
            "status": status}


def claim_manifest(name: str, namespace: str, request: str = "gpu",
                   capacity: Mapping[str, str] | None = None,
                   count: int | None = None) -> dict[str, Any]:
    """A ResourceClaim to create: one request of the driver's card class, with a share of
    consumable capacity when `capacity` is given, of `count` devices when given."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.elasticgpu.io"}
    if count is not None:
        exactly["count"] = count
    if capacity is not None:
        exactly["capacity"] = {"requests": dict(capacity)}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}}


def gated_claim_pod(name: str, namespace: str, scheduler: str,
                    node_selector: Mapping[str, str]) -> dict[str, Any]:
    """A pod of `scheduler` using the ResourceClaim `name` (request "gpu"), gated for our
    allocator as the webhook's `dra_gate` mutator leaves it, kept to the nodes of
    `node_selector`."""
    pod = pod_manifest(name, namespace, scheduler_name=scheduler)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    pod["spec"]["schedulingGates"] = [{"name": DRA_PLACEMENT_GATE}]
    pod["spec"]["nodeSelector"] = dict(node_selector)
    return pod


def env_of(spec: Mapping[str, Any], name: str) -> dict[str, str]:
    """The environment one CDI device of `spec` (a spec the plugin wrote) sets."""
    for device in spec.get("devices") or []:
        if device.get("name") == name:
            pairs = (item.split("=", 1) for item in device["containerEdits"].get("env") or [])
            return {key: value for key, value in pairs}
    raise KeyError(name)
