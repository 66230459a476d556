"""The mutators that write a pod's GPU resources as the agent and kube-scheduler read them:
whole cards as shares, a memory-only share's compute device, gpu-manager's hard limit, and the
node-level GPU count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.core.admission.jsonpatch import PatchOp, pointer, set_annotation
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.admission.rules import VCUDA_CORE, VCUDA_CORE_LIMIT
from elastic_gpu.core.claims.pods import ClaimAnnotationError, pod_claims
from elastic_gpu.core.nodefit import NODE_CORE, node_core
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.request import (
    DEVICE_PLUGIN_MEMORY,
    MEMORY_ONLY_COMPUTE,
    RequestKind,
    container_request,
    lifetime_containers,
)
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_WHOLE,
    MILLI_PER_CARD,
    MILLI_PER_PERCENT,
    ResourceError,
    to_amount,
)


def whole_cards_as_shares(data: MutationInput) -> list[PatchOp]:
    """`elasticgpu.io/gpu: N` is written as `elasticgpu.io/gpu-core: 100·N`, the same request
    (N exclusive whole cards, `core.request`) under the name every agent's share plugin
    advertises by default. No default node advertises `elasticgpu.io/gpu` (the whole-card
    plugin is the vendor's name, `nvidia.com/gpu`), and kubelet calls Allocate only for a name a
    device plugin registered: written as it is, the pod could never run with its card. Written
    as shares, kubelet calls the agent's share Allocate, which hands over the cards the
    scheduler assigned (docs/architecture.md, "`elasticgpu.io/gpu`: served as shares").
    Idempotent: the rewritten container no longer has the name.

    A multi-card share (the name beside a one-card share: N such shares on N cards,
    `core.request`) keeps it: there it counts the shares, and kubelet leaves a name no device
    plugin or node status advertises out of its fit check, while the agent's share plugin is
    called for the compute name beside it."""
    ops: list[PatchOp] = []
    for item in lifetime_containers(data.pod):
        try:
            if container_request(item.name, item.resources).multi_share:
                continue
        except ResourceError:
            pass  # validation refused it; the loop below skips what it cannot read
        for part in ("limits", "requests"):
            values = item.resources.get(part)
            if not isinstance(values, Mapping) or GPU_WHOLE not in values:
                continue
            try:
                cards = to_amount(GPU_WHOLE, values[GPU_WHOLE]).value
            except ResourceError:
                # validation read the limits (they win); requests that differ from them are
                # refused by kube-apiserver itself, in its words
                continue
            where = ("spec", item.field, item.index, "resources", part)
            ops.append({"op": "remove", "path": pointer(*where, GPU_WHOLE)})
            ops.append({"op": "add", "path": pointer(*where, GPU_CORE),
                        "value": str(cards * MILLI_PER_CARD // MILLI_PER_PERCENT)})
    return ops


def memory_only_compute(data: MutationInput) -> list[PatchOp]:
    """A memory-only share written with a memory name kubelet does not Allocate (advertised in
    the Node's status only) also asks for `elasticgpu.io/gpu-core: 1`, one device of the
    agent's share plugin: kubelet then calls the agent's Allocate, which hands over the card
    the scheduler chose. Idempotent: the container then has compute and is not memory-only.
    The ledger bills that 1 %; the container's isolation limit does not follow it
    (`core.request.limits_compute`: no compute asked, no compute limit)."""
    ops: list[PatchOp] = []
    name, value = MEMORY_ONLY_COMPUTE
    containers = {item.name: item for item in lifetime_containers(data.pod)}
    for request in data.request.containers:
        if request.kind is not RequestKind.SHARE or request.compute_milli != 0 or request.tflops:
            continue  # a TFLOPS share asks compute already, under a name the agent Allocates
        item = containers.get(request.name)
        if item is None or DEVICE_PLUGIN_MEMORY & set(request.resources):
            continue
        for part in ("limits", "requests"):
            values = item.resources.get(part)
            if isinstance(values, Mapping) and name not in values:
                ops.append({"op": "add", "path": pointer("spec", item.field, item.index,
                                                         "resources", part, name),
                            "value": value})
    return ops


def vcuda_core_limit(data: MutationInput) -> list[PatchOp]:
    """gpu-manager's `tencent.com/vcuda-core-limit` for pods sharing cards by
    `tencent.com/vcuda-core`: the share the containers ask (when they all ask the same one),
    so the vcuda runtime enforces it as a hard limit as the scheduler counted it. A value the
    user set is kept."""
    annotations = (data.pod.get("metadata") or {}).get("annotations") or {}
    if VCUDA_CORE_LIMIT in annotations:
        return []
    shares = {r.compute_milli for r in data.request.containers
              if r.kind is RequestKind.SHARE and VCUDA_CORE in r.resources and r.compute_milli}
    if len(shares) != 1:
        return []
    percent = shares.pop() // 10
    return [set_annotation(data.pod, VCUDA_CORE_LIMIT, str(percent))]


def node_resources(data: MutationInput) -> list[PatchOp]:
    """Each lifetime container (`core.request.lifetime_containers`: sidecars too) gets
    `node.elasticgpu.io/gpu-core` (`core.nodefit`), the GPU compute kube-scheduler counts at
    node level so that its preemption sees a node short of GPU (it sums a sidecar's with the
    containers'): in its limits, and in its requests when it has them. Read from the containers
    as the mutators before left them (a MIG substitution counts its instance); a container
    backed by a claim counts 0 (its ElasticGPU holds the cards). The webhook owns the name: a
    value already right is kept, any other replaced, and one on a container that counts 0
    removed, so a pod can neither understate nor inflate it; a pod that never wrote it and asks
    no GPU is untouched."""
    ops: list[PatchOp] = []
    try:
        claimed = set(pod_claims(data.pod))
    except ClaimAnnotationError:
        claimed = set()
    for item in lifetime_containers(data.pod):
        try:
            count = 0 if item.name in claimed else node_core(
                container_request(item.name, item.resources))
        except (ResourceError, ValueError):
            count = 0
        for part in ("limits", "requests"):
            values = item.resources.get(part)
            if not isinstance(values, Mapping):
                continue
            path = pointer("spec", item.field, item.index, "resources", part, NODE_CORE)
            if count == 0:
                if NODE_CORE in values:
                    ops.append({"op": "remove", "path": path})
            elif not _quantity_is(values.get(NODE_CORE), count):
                ops.append({"op": "replace" if NODE_CORE in values else "add", "path": path,
                            "value": str(count)})
    return ops


def _quantity_is(raw: Any, value: int) -> bool:
    """Whether `raw` is the quantity `value` in any spelling (the apiserver stores 1000 as
    `1k`: a reinvoked webhook must not see it as another value)."""
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        return False
    try:
        return parse_quantity(raw) == value
    except QuantityError:
        return False
