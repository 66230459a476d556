"""Which nodes serve GPUs through DRA, and what the scheduler extender decides for them. Pure.

A node is in one mode (`node_mode`, the one answer every component reads: the agents, the
extender, the webhook's facts, the sandbox): device plugin (GPUDevices, the extender places
cards and writes the assignment) or DRA (the node label `elasticgpu.io/gpu-mode: dra`, the
operator's node-group label; the chart's DRA agent DaemonSet selects it). A DRA-mode node has
no GPUDevices and advertises no device-plugin GPU name; kube-scheduler's DynamicResources
plugin allocates its devices from the ResourceSlices (`core.dra.devices`), claims and the
DeviceClasses' `extendedResourceName` mapping alike. The extender is still called for a pod asking one of
its managed resources, and for a DRA-mode node it:

- passes the node when every GPU name the pod writes is one a DeviceClass serves through the
  extended-resource mapping (`nvidia.com/gpu`: whole cards), leaving the fit to
  kube-scheduler, which creates the pod's special claim and allocates it;
- refuses it, naming the way to ask, for every other GPU name (fractions, memory, TFLOPS,
  MIG resource names, ElasticGPUClaims): no DeviceClass maps them, and our card state has
  no cards there to place them on;
- binds without reserving cards or writing an assignment (DynamicResources' PreBind has
  written the allocation before the extender's bind verb is called), a pod naming
  ResourceClaims too: it asks no GPU name, but the quota's accounting names the webhook puts
  on it from its claims (`core.dra.podclaims`) are managed resources, so kube-scheduler sends
  it to the extender (`extender_binds`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS, device_classes
from elastic_gpu.core.dra.podclaims import claim_refs
from elastic_gpu.core.fit import FitFailure, FitKind
from elastic_gpu.core.request import PodRequest


class GpuMode(StrEnum):
    """How a node serves its GPUs; the value is the one `GPU_MODE_LABEL` carries for it."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


#: The node label that puts a node in a GPU mode; its value for DRA. A node without the label
#: (or with any other value) is a device-plugin node: that is how every node was before DRA.
GPU_MODE_LABEL = "elasticgpu.io/gpu-mode"
GPU_MODE_DRA = GpuMode.DRA.value
#: The label selector of the DRA-mode nodes (a LIST or watch of them alone).
DRA_NODE_SELECTOR = f"{GPU_MODE_LABEL}={GPU_MODE_DRA}"

#: The GPU names a DeviceClass of ours serves on a DRA node (its `extendedResourceName`).
DRA_EXTENDED_NAMES: frozenset[str] = frozenset(
    str(c["spec"]["extendedResourceName"]) for c in device_classes()
    if c["spec"].get("extendedResourceName"))


def node_mode(labels: Mapping[str, Any] | None) -> GpuMode:
    """The mode of a node with these labels."""
    return GpuMode.DRA if (labels or {}).get(GPU_MODE_LABEL) == GPU_MODE_DRA \
        else GpuMode.DEVICE_PLUGIN


def is_dra_node(labels: Mapping[str, Any] | None) -> bool:
    """Whether a node with these labels serves its GPUs through DRA."""
    return node_mode(labels) is GpuMode.DRA


def node_object_labels(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """The labels of a Node object as read from the API (none: empty)."""
    labels = (node.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def dra_fit_failure(request: PodRequest, *, names_claims: bool) -> FitFailure | None:
    """Why a pod cannot go to a DRA-mode node (None: it may, kube-scheduler decides the fit);
    the same for every DRA-mode node, so the failure does not name one (`core.fit`).
    `names_claims`: the pod names ElasticGPUClaims (cards of our ledger, none there)."""
    if names_claims:
        return FitFailure(FitKind.DRA_NAMES_CLAIMS, device_class=CARD_CLASS)
    unserved = sorted({name for c in request.gpu_containers for name in c.resources}
                      - DRA_EXTENDED_NAMES)
    if not unserved:
        return None
    # MIG resource names only: the way to ask is a claim of the MIG class, not a share
    mig_only = all(c.mig_profile is not None for c in request.gpu_containers
                   if set(c.resources) - DRA_EXTENDED_NAMES)
    return FitFailure(FitKind.DRA_NOT_SERVED, asked=tuple(unserved),
                      offered=tuple(sorted(DRA_EXTENDED_NAMES)),
                      device_class=MIG_CLASS if mig_only else CARD_CLASS)


def extender_binds(request: PodRequest, pod: Mapping[str, Any], dra_node: bool) -> bool:
    """Whether the extender's bind takes the pod: a GPU pod, or, on a DRA-mode node, a pod
    naming ResourceClaims (sent for the quota's accounting names of its claims; its claims
    are allocated before bind, so the Binding alone remains)."""
    return request.wants_gpu or (dra_node and bool(claim_refs(pod)))
