"""Which container an Allocate call is for: pending pods, their assignments, no guessing.

kubelet's Allocate says only "N devices of resource R"; it does not name the pod. The
scheduler wrote the chosen cards into the pod's `elasticgpu.io/assignment` annotation before
the Binding, so by the time kubelet admits the pod the annotation is in the API. A candidate
is a container of a pod (a regular one or a sidecar, `core.request.lifetime_containers`) that
- is bound to this node, not terminating, not finished, and its assignment is the
  scheduler's for this node (`core.assignment.distrust`: the Binding writes the node, the
  assignment and `elasticgpu.io/assigned-node` together, and an admission policy keeps anyone
  else from writing the annotations; docs/architecture.md, "Who writes the ledger");
- asks for exactly N of R (the count kubelet passes is the container's quantity of R);
- has cards in the assignment and has not been served R by this agent yet (`done`).
One candidate: it is the one. Several candidates that would all get the very same cards and
shares: any of them (the earliest) is right, because the answer does not depend on the
choice. Several candidates that would get different cards: REFUSE with an error naming them;
kubelet then fails that pod's admission (the pod can be recreated) instead of a container
silently getting another pod's card.

The pods come from a live list of the node's Pending pods (see pods.py), so the pod kubelet
admits is always among them. `done` is the agent's memory of what it served; nothing is
written to the pod. An agent restarted between a pod's Allocate and its start forgets that
pod: if another Pending pod then asks for the same count of R with different cards, the two
are ambiguous and Allocate refuses (a pod fails admission and is recreated); it never
guesses, so forgetting costs at worst a refusal, never a wrong card.

Before serving, the chosen cards are checked against the node's own ledger
(`accounting.overcommit`):
the trusted assignments of the other live pods bound to this node, read live. A container is
never handed a card those already fill (compute beyond the card, memory beyond its memory, a MIG
instance another holds): whatever a pod carries, the agent never serves the cards another live
pod holds (issue #26, docs/architecture.md "Who writes the ledger").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import (
    AssignmentError,
    CardShare,
    distrust,
    pod_assignment,
)
from elastic_gpu.core.podlife import finished
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.request import (
    RequestKind,
    SpecContainer,
    container_request,
    lifetime_containers,
    limits_compute,
)
from elastic_gpu.core.resources import ResourceError

#: Candidates named in an ambiguity error (the message goes to kubelet's event and log).
MAX_NAMED = 5


class AllocateError(RuntimeError):
    """Allocate cannot be answered safely; the message is returned to kubelet."""


@dataclass(frozen=True)
class Candidate:
    namespace: str
    pod: str
    uid: str
    container: str
    created: str
    shares: tuple[CardShare, ...]
    #: the ElasticGPU whose cards these are (a claim-backed container), None for the pod's own
    claim: str | None = None
    #: the cards the container's share asks (N for a multi-card share, 1 for a one-card
    #: share; 0: not a share, or unreadable)
    share_cards: int = 0
    #: whether its isolation limits compute: the container asked some
    #: (`core.request.limits_compute`; False for a memory-only share)
    limits_compute: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.uid, self.container)

    def describe(self) -> str:
        cards = ",".join(str(s.index) for s in self.shares)
        return f"{self.namespace}/{self.pod}[{self.container}] (cards {cards})"


def container_quantity(container: Mapping[str, Any], resource: str) -> int | None:
    resources: Mapping[str, Any] = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(resource,
                                                (resources.get("requests") or {}).get(resource))
    if value is None:
        return None
    try:
        quantity = parse_quantity(value)
    except QuantityError:
        return None
    return int(quantity) if quantity.denominator == 1 else None


def candidates(pods: Iterable[Mapping[str, Any]], node: str, resource: str, count: int,
               done: Collection[tuple[str, str, str]]) -> tuple[list[Candidate], list[str]]:
    """Containers that may be the one Allocate serves, and problems seen on the way."""
    found: list[Candidate] = []
    problems: list[str] = []
    for pod in pods:
        meta: Mapping[str, Any] = pod.get("metadata") or {}
        spec: Mapping[str, Any] = pod.get("spec") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        if spec.get("nodeName") != node or meta.get("deletionTimestamp"):
            continue
        if finished(pod):
            continue
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            assignment = pod_assignment(pod)
        except AssignmentError as err:
            problems.append(f"{name}: {err}")
            continue
        if assignment is None:
            continue
        untrusted = distrust(node, annotations.get(ann.ASSIGNED_NODE), assignment)
        if untrusted is not None:
            problems.append(f"{name}: assignment not the scheduler's: {untrusted}")
            continue
        uid = str(meta.get("uid", ""))
        # kubelet calls Allocate for sidecars too, and they keep their devices for the pod's
        # life (classic init containers ask no GPU: admission refuses them)
        for item in lifetime_containers(pod):
            container, cname = item.container, item.name
            if container_quantity(container, resource) != count:
                continue
            if (uid, cname, resource) in done:
                continue
            shares = assignment.containers.get(cname)
            if not shares:
                problems.append(f"{name}[{cname}] asks for {resource} but has no cards assigned")
                continue
            found.append(Candidate(str(meta.get("namespace", "")), str(meta.get("name", "")), uid,
                                   cname, str(meta.get("creationTimestamp", "")), shares,
                                   assignment.claims.get(cname), *_share_shape(item)))
    return found, problems


def _share_shape(item: SpecContainer) -> tuple[int, bool]:
    """The cards a container's share asks and whether its compute is limited
    (`Candidate.share_cards`, `Candidate.limits_compute`)."""
    try:
        request = container_request(item.name, item.resources)
    except (ResourceError, ValueError):
        return 0, True
    return (request.cards if request.kind is RequestKind.SHARE else 0,
            limits_compute(request))


def choose(found: Sequence[Candidate], problems: Sequence[str], node: str, resource: str,
           count: int) -> Candidate:
    """The one safe candidate, or AllocateError."""
    if not found:
        hint = f"; seen: {'; '.join(problems)}" if problems else ""
        raise AllocateError(f"no pod bound to {node} waits for {count} {resource} with an "
                            f"Elastic GPU assignment{hint}")
    outcomes = {c.shares for c in found}
    if len(outcomes) > 1:
        names = ", ".join(c.describe() for c in found[:MAX_NAMED])
        if len(found) > MAX_NAMED:
            names += f" and {len(found) - MAX_NAMED} more"
        raise AllocateError(f"ambiguous Allocate of {count} {resource}: {names} all wait for it "
                            "with different cards; refusing rather than guessing")
    return min(found, key=lambda c: (c.created, c.namespace, c.pod, c.container))

