"""Dynamic MIG's demand on DRA nodes: the MIG instances waiting claims ask. Pure.

A claim of the MIG class (`mig.gpu.elasticgpu.io`) asks its instances in any shape the one
reader of MIG requests understands (`core.dra.migselect`): a profile by equality, several
joined by `||` (or `in [...]`), a memory bound (`compareTo(quantity("20Gi")) >= 0`: the smallest
profile with at least that memory, per model), DRA's prioritized list (`firstAvailable`: the
first subrequest the planner can serve, in order), with a request's `count` (default 1). Each
instance becomes one `MigDemand` whose `profile` is the first accepted and `alternatives` the
rest, in order. `pod_claim_demand` turns a waiting pod's unallocated claims into the planner's
demand, keyed by the claim (`core.dra.inventory.claim_key`, `#1`, `#2`... for further
instances), so a claim shared by several waiting pods is one demand; what the reader cannot
read comes back as a problem per claim (the controller reports it once), never as a guess.

A waiting pod is one kube-scheduler found no node for, or one our DRA allocator holds behind
its gate (`gated_for_placement`): the allocator places MIG claims itself and keeps a pod gated
while no instance fits on a node opted in to dynamic MIG, so the carve it waits for is asked
here, and the allocator places it on the carved instance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.inventory import claim_key
from elastic_gpu.core.dra.migselect import MigAsk, mig_asks
from elastic_gpu.core.dra.podclaims import claim_refs
from elastic_gpu.core.mig.cardstate import MigDemand


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def claim_instances(spec: Mapping[str, Any]) -> tuple[list[MigAsk], list[str]]:
    """One ask per MIG instance a claim spec asks (a request of `count` N is N of them), and
    what could not be read (`core.dra.migselect.mig_asks`)."""
    asks, problems = mig_asks(spec)
    return [ask for ask in asks for _ in range(ask.count)], problems


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: named ones, and its templates' claims as
    `status.resourceClaimStatuses` names them (none before kube-controller-manager made them)."""
    made = {str(_mapping(s).get("name")): _mapping(s).get("resourceClaimName")
            for s in _mapping(pod.get("status")).get("resourceClaimStatuses") or []}
    names = []
    for ref in claim_refs(pod):
        name = made.get(ref.entry) if ref.template else ref.name
        if isinstance(name, str) and name:
            names.append(name)
    return names


@dataclass(frozen=True)
class Unread:
    """A waiting pod's claim whose MIG requests could not be read: no demand, reported."""

    claim: str
    problem: str


def pod_claim_demand(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
                     nodes: frozenset[str] | None) -> tuple[list[MigDemand], list[Unread]]:
    """A waiting pod's MIG demand through claims, and the claims it could not read: `claims`
    by `<namespace>/<name>`; an allocated claim, or one not seen yet, asks nothing. `nodes`:
    where the pod may run."""
    namespace = str(_mapping(pod.get("metadata")).get("namespace", ""))
    out: list[MigDemand] = []
    unread: list[Unread] = []
    for name in pod_claim_names(pod):
        claim = claims.get(f"{namespace}/{name}")
        if claim is None or _mapping(claim.get("status")).get("allocation"):
            continue
        key = claim_key(namespace, name)
        asks, problems = claim_instances(_mapping(claim.get("spec")))
        unread += [Unread(f"{namespace}/{name}", problem) for problem in problems]
        for k, ask in enumerate(asks):
            out.append(MigDemand(key if k == 0 else f"{key}#{k}", ask.profiles[0], nodes,
                                 alternatives=ask.profiles[1:]))
    return out, unread


def gated_for_placement(pod: Mapping[str, Any]) -> bool:
    """Unbound, Pending, not being deleted, and behind our DRA placement gate: it waits for our
    allocator (which holds it gated while no instance fits; `core.dra.claim_placement`)."""
    spec, meta = _mapping(pod.get("spec")), _mapping(pod.get("metadata"))
    if spec.get("nodeName") or meta.get("deletionTimestamp"):
        return False
    if _mapping(pod.get("status")).get("phase", "Pending") != "Pending":
        return False
    return any(_mapping(g).get("name") == DRA_PLACEMENT_GATE
               for g in spec.get("schedulingGates") or [])
