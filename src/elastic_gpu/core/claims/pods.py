"""Pods that name claims: their `egpuc.elasticgpu.io/<container>` annotations, the claims'
protection finalizer, which pods use or hold what, and how a pod's claim-backed containers are
placed (`resolve_pod_claims`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core import podlife
from elastic_gpu.core.annotations import ASSIGNMENT, CLAIM_PREFIX
from elastic_gpu.core.assignment import Assignment, AssignmentError, CardShare
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.blocks import BlockKind, ClaimBlock
from elastic_gpu.core.claims.decisions import Lost, Pending, Provision
from elastic_gpu.core.claims.model import (
    Claim,
    ClaimRef,
    ElasticGPU,
    ElasticGPUPhase,
    GPUClass,
    PendingReason,
    provisioned_name,
)
from elastic_gpu.core.fit import FitFailure, FitKind
from elastic_gpu.core.names import NameRule, name_refusal
from elastic_gpu.core.request import classic_init_containers, lifetime_containers

# --------------------------------------------------------------------------- pods


class ClaimAnnotationError(ValueError):
    """A pod's egpuc.elasticgpu.io/* annotations that cannot be read; the message names the
    annotation, the value and the rule (the webhook's refusal)."""


def pod_claims(pod: Mapping[str, Any]) -> dict[str, str]:
    """container name -> claim name, from the pod's `egpuc.elasticgpu.io/<container>: <claim>`
    annotations (the claims are in the pod's namespace). A container is one that runs for the
    pod's life (`core.request.lifetime_containers`: a regular container or a sidecar, as for a
    GPU share of its own); naming a classic init container is an error that says why. A key
    whose suffix names no container means the only regular container of a one-container pod
    (the seed README writes `test1` on a container `test-cuda`); with several it is an error
    that says so."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not any(isinstance(k, str) and k.startswith(CLAIM_PREFIX) for k in annotations):
        return {}  # most pods: no claim, so no need to read the containers
    lifetime = [c.name for c in lifetime_containers(pod)]
    regular = [c.name for c in lifetime_containers(pod) if c.field == "containers"]
    classic_init = {c.name for c in classic_init_containers(pod)}
    out: dict[str, str] = {}
    for key in sorted(k for k in annotations if isinstance(k, str) and k.startswith(CLAIM_PREFIX)):
        value = annotations[key]
        suffix = key[len(CLAIM_PREFIX):]
        if not isinstance(value, str) or name_refusal(value, NameRule.SUBDOMAIN) is not None:
            raise ClaimAnnotationError(f"annotation {key}={value!r}: the value must name an "
                                       "ElasticGPUClaim of the pod's namespace (a DNS subdomain)")
        if suffix in lifetime:
            container = suffix
        elif suffix in classic_init:
            raise ClaimAnnotationError(
                f"annotation {key}={value}: {suffix} is an init container that runs to "
                "completion before the pod's containers start, and a claim's cards are held "
                "for the pod's life; name a regular container or a sidecar (an init container "
                "with restartPolicy: Always)")
        elif len(regular) == 1:
            container = regular[0]
        else:
            raise ClaimAnnotationError(
                f"annotation {key}={value}: the pod has containers {', '.join(lifetime) or 'none'}"
                f" and none is named {suffix!r}; write {CLAIM_PREFIX}<container>: <claim>")
        if container in out:
            raise ClaimAnnotationError(
                f"annotation {key}={value}: container {container} already uses claim "
                f"{out[container]}; a container uses at most one claim")
        out[container] = value
    return out


#: The finalizer on every claim (a PVC's kubernetes.io/pvc-protection), from its creation (the
#: webhook's `protection_patch`; the controller adds it to one created without): a claim
#: deleted while a pod uses it stays (deletionTimestamp set) until no pod that names it is
#: left running.
CLAIM_PROTECTION_FINALIZER = "elasticgpu.io/claim-protection"


def protection_patch(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch that gives a claim being created the claim-protection finalizer (the
    webhook's, at CREATE, whoever creates it: a PVC gets `kubernetes.io/pvc-protection` the
    same way), empty when it has it. Other finalizers are kept."""
    meta = claim.get("metadata")
    finalizers = meta.get("finalizers") if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping):
        return [{"op": "add", "path": "/metadata",
                 "value": {"finalizers": [CLAIM_PROTECTION_FINALIZER]}}]
    if not isinstance(finalizers, list):
        return [{"op": "add", "path": "/metadata/finalizers",
                 "value": [CLAIM_PROTECTION_FINALIZER]}]
    if CLAIM_PROTECTION_FINALIZER in finalizers:
        return []
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": CLAIM_PROTECTION_FINALIZER}]


def _named_claims(pod: Mapping[str, Any]) -> set[str]:
    """The claims a pod's annotations name; one whose annotations cannot be read names every
    claim any of its claim annotations mentions (the safe side: its cards may be in use)."""
    try:
        return set(pod_claims(pod).values())
    except ClaimAnnotationError:
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        return {v for k, v in notes.items()
                if isinstance(k, str) and k.startswith(CLAIM_PREFIX) and isinstance(v, str)}


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name')}"


def pods_using(claim: Claim, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pods (namespace/name) of the claim's namespace that name it and have not stopped
    (`core.podlife.stopped`: a terminal phase, or deleted with every container terminated;
    a Pending pod counts): while any is left, the claim's finalizer stays."""
    return sorted(_pod_key(pod) for pod in pods
                  if (pod.get("metadata") or {}).get("namespace", "default") == claim.namespace
                  and not podlife.stopped(pod) and claim.name in _named_claims(pod))


def pods_holding(egpu: ElasticGPU, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pods (namespace/name) that have not stopped and use the ElasticGPU's cards: their
    assignment's `claims` name it, or their annotations name the claim its claimRef names.
    While any is left it is neither released nor deleted (issue #26: a claim whose finalizer
    was missing or removed must not take the card from under its pod). An assignment that
    cannot be read counts if its text mentions the ElasticGPU (the safe side)."""
    ref = egpu.claim_ref
    out = []
    for pod in pods:
        if podlife.stopped(pod):
            continue
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(ASSIGNMENT)
        uses = False
        if isinstance(text, str) and text:
            try:
                uses = egpu.name in Assignment.from_json(text).claims.values()
            except AssignmentError:
                uses = egpu.name in text
        if not uses and ref is not None and meta.get("namespace", "default") == ref.namespace:
            uses = ref.name in _named_claims(pod)
        if uses:
            out.append(_pod_key(pod))
    return sorted(out)


# --------------------------------------------------------------------------- pods that name claims


def bound_elasticgpu(claim: Claim, egpus: Mapping[str, ElasticGPU]) -> ElasticGPU | None:
    """The ElasticGPU whose cards a pod naming `claim` uses: the one the claim is bound to
    (`spec.elasticGPUName`), or the provisioned `egpu-<uid>` pre-bound to it (provisioning
    done, the controller has not written the claim yet); its claimRef must name the claim.
    None while the claim is not bound."""
    name = claim.elastic_gpu_name or provisioned_name(claim)
    egpu = egpus.get(name)
    if egpu is None or egpu.claim_ref is None or not egpu.claim_ref.matches(claim):
        return None
    if egpu.phase in (ElasticGPUPhase.RELEASED, ElasticGPUPhase.FAILED) or not egpu.node:
        return None
    return egpu


@dataclass(frozen=True)
class PodClaims:
    """How a pod's claim-backed containers are placed (`resolve_pod_claims`).

    - `bound`: container -> the ElasticGPU it uses (node and cards fixed);
    - `first_consumer`: container -> an unbound WaitForFirstConsumer claim, provisioned on the
      node the pod is bound to, with the cards chosen for that container;
    - `blocked`: why no node can take the pod now (a claim missing, Pending, being deleted,
      or bound ElasticGPUs on different nodes), typed (`blocks.describe_blocks` says it);
      empty if it can be placed;
    - `waits_for`: the claims (namespace/name) whose change may unblock it.
    """

    bound: Mapping[str, ElasticGPU] = field(default_factory=dict)
    first_consumer: Mapping[str, Claim] = field(default_factory=dict)
    blocked: tuple[ClaimBlock, ...] = ()
    waits_for: frozenset[str] = frozenset()

    @property
    def node(self) -> str | None:
        """The node the pod must go to: its bound ElasticGPUs' (None: any)."""
        return next((e.node for e in self.bound.values()), None)

    def marks(self) -> dict[str, str]:
        """The assignment's `claims` mark: container -> ElasticGPU name (bound ones; the
        first-consumer ones get theirs when provisioned, `provisioned_name`)."""
        out = {c: e.name for c, e in self.bound.items()}
        out.update({c: provisioned_name(claim) for c, claim in self.first_consumer.items()})
        return out


def resolve_pod_claims(namespace: str, named: Mapping[str, str],
                       claims: Mapping[tuple[str, str], Claim],
                       classes: Mapping[str, GPUClass],
                       egpus: Mapping[str, ElasticGPU]) -> PodClaims:
    """Place the claim-backed containers of a pod of `namespace` whose containers name claims
    (`named`: container -> claim name, from `pod_claims`), given what the API says."""
    bound: dict[str, ElasticGPU] = {}
    first: dict[str, Claim] = {}
    blocked: list[ClaimBlock] = []
    waits: set[str] = set()
    for container, claim_name in sorted(named.items()):
        claim = claims.get((namespace, claim_name))
        key = f"{namespace}/{claim_name}"
        if claim is None:
            blocked.append(ClaimBlock(BlockKind.MISSING, key))
            waits.add(key)
            continue
        if claim.deleting:
            blocked.append(ClaimBlock(BlockKind.DELETING, key))
            continue
        egpu = bound_elasticgpu(claim, egpus)
        if egpu is not None:
            bound[container] = egpu
            continue
        waits.add(key)
        decision = decide(claim, classes, egpus)
        if isinstance(decision, Pending) and \
                decision.reason is PendingReason.WAIT_FOR_FIRST_CONSUMER:
            first[container] = claim
        elif isinstance(decision, Pending | Lost):
            blocked.append(ClaimBlock(BlockKind.PENDING, claim.key, message=decision.message))
        elif isinstance(decision, Provision):
            blocked.append(ClaimBlock(BlockKind.NOT_PROVISIONED, claim.key,
                                      provisioner=decision.provisioner))
        else:
            blocked.append(ClaimBlock(BlockKind.BEING_BOUND, claim.key,
                                      elastic_gpu=decision.elastic_gpu))
    for claim_name in sorted({c.name for c in first.values()}):
        sharing = sorted(c for c, claim in first.items() if claim.name == claim_name)
        if len(sharing) > 1:
            blocked.append(ClaimBlock(BlockKind.FIRST_CONSUMER_SHARED, f"{namespace}/{claim_name}",
                                      containers=tuple(sharing)))
    nodes = sorted({e.node for e in bound.values()})
    if len(nodes) > 1:
        blocked.append(ClaimBlock(BlockKind.SPLIT_NODES, placements=tuple(
            (c, e.name, e.node) for c, e in sorted(bound.items()))))
    return PodClaims(bound, first, tuple(blocked), frozenset(waits))


def off_node_failure(container: str, claim_key: str, egpu: ElasticGPU) -> FitFailure:
    """Why a node other than the bound ElasticGPU's cannot take the pod (`fit.describe`)."""
    return FitFailure(FitKind.CLAIM_ON_OTHER_NODE, container=container, claim=claim_key,
                      elastic_gpu=egpu.name, node=egpu.node)


def first_consumer_elasticgpu(claim: Claim, cls: GPUClass, node: str,
                              shares: tuple[CardShare, ...]) -> ElasticGPU:
    """The ElasticGPU a WaitForFirstConsumer claim gets when its first pod is bound to `node`,
    holding the cards chosen for that pod's container (pre-bound to the claim, like
    `provision`'s)."""
    return ElasticGPU(name=provisioned_name(claim), capacity=dict(claim.requests), node=node,
                      shares=shares, claim_ref=ClaimRef.of(claim), class_name=cls.name,
                      reclaim_policy=cls.reclaim_policy, phase=ElasticGPUPhase.BOUND)
