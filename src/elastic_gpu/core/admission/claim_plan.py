"""Claims (issue #15): what the ElasticGPUClaims a pod names mean for its containers.

A pod naming claims by `egpuc.elasticgpu.io/<container>: <claim>` is checked against the claims
it names (`PodClaims`, looked up by the webhook: they exist in the pod's namespace, are not being
deleted, and the container asks no GPU of its own), and each container gets its claim's
requests, translated to the names the agent advertises (`claim_container_resources`). The plan
is made once and used twice: by validation (which checks the containers as they will be stored)
and by the claims' mutator (`mutators.claims`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.jsonpatch import PatchOp, pointer
from elastic_gpu.core.admission.rules import AdmissionRule, Refusal, from_resource_error
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.claims.pods import ClaimAnnotationError, pod_claims
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.request import container_request, lifetime_containers
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_MEMORY,
    GPU_TFLOPS,
    Measure,
    ResourceError,
    lookup,
    to_amount,
)

#: The whole-card resource the agent advertises by default (`resources.gpu`, docs/agent.md).
CARD_RESOURCE = "nvidia.com/gpu"
#: What a claim's request becomes in its container: per measure of the resource table, the
#: name the agent advertises by default (device-plugin resources, so that kubelet calls the
#: agent's Allocate, and managed by the extender in kube-scheduler's configuration). A compute
#: request of whole cards (gpu-core: 200) becomes that many cards; MIG names are kept.
CLAIM_RESOURCE_NAMES: Mapping[Measure, str] = {
    Measure.COMPUTE: GPU_CORE,
    Measure.MEMORY: GPU_MEMORY,
    Measure.CARDS: CARD_RESOURCE,
    Measure.TFLOPS: GPU_TFLOPS,
}


def claim_container_resources(requests: Mapping[str, int | str]) -> dict[str, str]:
    """A claim's `spec.resources.requests` as a container's resources under the names the
    agent advertises (`CLAIM_RESOURCE_NAMES`), each value converted through the resource
    table's units (`tencent.com/vcuda-memory: 4` is 1024 MiB of `elasticgpu.io/gpu-memory`).
    Raises `ResourceError` (resource, value, rule) for a value that breaks its row."""
    out: dict[str, str] = {}
    for name in sorted(requests):
        amount = to_amount(name, requests[name])
        measure = amount.spec.measure
        if measure is Measure.MIG:
            target, value = amount.spec.name, amount.value
        elif measure is Measure.COMPUTE and amount.whole_cards:
            target, value = CLAIM_RESOURCE_NAMES[Measure.CARDS], amount.whole_cards
        else:
            target = CLAIM_RESOURCE_NAMES[measure]
            spec = lookup(target)
            assert spec is not None and spec.measure is measure
            if amount.value % spec.scale:
                raise ResourceError(name, requests[name], f"not a whole number of {spec.doc}")
            value = amount.value // spec.scale
        if target in out:
            raise ResourceError(", ".join(sorted(requests)), "",
                                f"the claim asks for {measure.value} twice; use one name")
        out[target] = str(value)
    return out


@dataclass(frozen=True)
class PodClaims:
    """The ElasticGPUClaims a pod names, as the adapter found them in the pod's namespace:
    claim name -> the claim, or None when it does not exist there (a name missing from the
    mapping counts as not existing)."""

    namespace: str = "default"
    claims: Mapping[str, Claim | None] = field(default_factory=dict)


def claim_names(pod: Any) -> frozenset[str]:
    """The claim names a pod's annotations name (what the adapter must look up); empty for a
    pod whose claim annotations cannot be read (admission refuses it, naming why)."""
    try:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not any(isinstance(k, str) and k.startswith(ann.CLAIM_PREFIX) for k in annotations):
            return frozenset()
        return frozenset(pod_claims(pod).values())
    except (ClaimAnnotationError, AttributeError, TypeError):
        return frozenset()


def _claim_key(annotations: Mapping[str, str], container: str, claim: str) -> str:
    """The annotation that made `container` use `claim` (for messages)."""
    own = f"{ann.CLAIM_PREFIX}{container}"
    if annotations.get(own) == claim:
        return own
    return next((k for k in sorted(annotations) if k.startswith(ann.CLAIM_PREFIX)
                 and annotations[k] == claim), own)


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except (QuantityError, TypeError, ValueError):
        return False


def _own_gpu_resources(resources: Mapping[str, Any], wanted: Mapping[str, str]) -> list[str]:
    """The GPU resources of a container that are not the claim's (a name the claim's
    translation lacks, or another value): a container carrying exactly the claim's resources
    (mutated already: a reinvocation) has none."""
    own: set[str] = set()
    for part in ("limits", "requests"):
        for key, value in (resources.get(part) or {}).items():
            try:
                gpu = lookup(key) is not None
            except ResourceError:
                gpu = True
            if gpu and not (key in wanted and _same_quantity(value, wanted[key])):
                own.add(key)
    return sorted(own)


@dataclass(frozen=True)
class ClaimPlan:
    """What the claims a pod names mean: the refusals, or per container name the resources
    to add (and the claim behind each container, for messages). A container is a regular one
    or a sidecar (`core.request.lifetime_containers`), as `pod_claims` reads the annotations."""

    refusals: list[Refusal]
    resources: dict[str, dict[str, str]]
    sources: dict[str, str]


def claim_plan(pod: Mapping[str, Any], claims: PodClaims) -> ClaimPlan:
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    if not any(k.startswith(ann.CLAIM_PREFIX) for k in annotations):
        return ClaimPlan([], {}, {})
    try:
        named = pod_claims(pod)
    except ClaimAnnotationError as err:
        return ClaimPlan([Refusal(AdmissionRule.CLAIM_ANNOTATION, "", "", str(err))], {}, {})
    namespace = claims.namespace
    containers = {c.name: c for c in lifetime_containers(pod)}
    refusals: list[Refusal] = []
    resources: dict[str, dict[str, str]] = {}
    sources: dict[str, str] = {}
    for container, claim_name in sorted(named.items()):
        key = _claim_key(annotations, container, claim_name)
        claim = claims.claims.get(claim_name)
        where = f"ElasticGPUClaim {claim_name}"
        if claim is None:
            refusals.append(Refusal(AdmissionRule.CLAIM_NOT_FOUND, key, claim_name,
                                    f"{where} does not exist in namespace {namespace}; "
                                    "create it first", container))
            continue
        if claim.deleting:
            refusals.append(Refusal(AdmissionRule.CLAIM_DELETING, key, claim_name,
                                    f"{where} in namespace {namespace} is being deleted",
                                    container))
            continue
        try:
            wanted = claim_container_resources(claim.requests)
            gpu = container_request(container, {"limits": wanted}).wants_gpu
        except ResourceError as err:
            refusal = from_resource_error(err, container)
            refusals.append(replace(refusal, detail=f"{refusal.detail} (in the requests of "
                                                    f"{where})"))
            continue
        if not gpu:
            refusals.append(Refusal(AdmissionRule.CLAIM_REQUEST, key, claim_name,
                                    f"{where} asks for no GPU (all its requests are 0)",
                                    container))
            continue
        own = _own_gpu_resources(containers[container].resources, wanted)
        if own:
            refusals.append(Refusal(
                AdmissionRule.CLAIM_CONTAINER_GPU, ", ".join(own), "",
                f"container {container} gets its GPUs from {where} ({key}); remove its own GPU "
                "resources, or the claim annotation", container))
            continue
        resources[container] = wanted
        sources[container] = f"{namespace}/{claim_name}"
    return ClaimPlan(refusals, resources, sources)


def claim_ops(pod: Mapping[str, Any], plan: ClaimPlan) -> list[PatchOp]:
    """Add each claim's resources to its container's limits and requests, where missing
    (a sidecar's under `/spec/initContainers/<index>`)."""
    ops: list[PatchOp] = []
    for item in lifetime_containers(pod):
        wanted = plan.resources.get(item.name)
        if wanted is None:
            continue
        at = ("spec", item.field, item.index, "resources")
        resources = item.container.get("resources")
        if not isinstance(resources, Mapping):
            ops.append({"op": "add", "path": pointer(*at),
                        "value": {"limits": dict(wanted), "requests": dict(wanted)}})
            continue
        for part in ("limits", "requests"):
            values = resources.get(part)
            if not isinstance(values, Mapping):
                ops.append({"op": "add", "path": pointer(*at, part), "value": dict(wanted)})
                continue
            for name, value in wanted.items():
                if name not in values:
                    ops.append({"op": "add", "path": pointer(*at, part, name), "value": value})
    return ops
